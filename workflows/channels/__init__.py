"""Channels: Telegram updates in, replies and due reminders out."""
