"""The /memories/ admin site: the site and what its tabs share (site), the tabs (tabs, health_tab, teams), bulk actions (actions).

Django's admin autodiscovery imports `memory.admin`; importing the tabs registers them.
"""

from . import health_tab, tabs, teams  # noqa: F401
