"""The subcommands of `python manage.py memory`: what they share (base), what reports on the memory
(reporting) and what changes or moves it (maintenance)."""
