"""Django project configuration for the Engram site."""
