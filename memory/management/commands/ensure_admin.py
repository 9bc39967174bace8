"""Create a staff superuser for /memories/ from ENGRAM_ADMIN_PASSWORD, if it does not exist yet."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create (once) a superuser whose password is read from the ENGRAM_ADMIN_PASSWORD environment variable."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username, **options):
        password = os.environ.get("ENGRAM_ADMIN_PASSWORD", "")
        if not password:
            raise CommandError("ENGRAM_ADMIN_PASSWORD is not set")
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"user {username!r} exists; password unchanged")
            return
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"created superuser {username!r}")
