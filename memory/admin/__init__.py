"""The /memories/ admin site: the site and what its tabs share (site), the tabs (tabs), bulk actions (actions).

Django's admin autodiscovery imports `memory.admin`; importing the tabs registers them.
"""

from . import tabs  # noqa: F401
