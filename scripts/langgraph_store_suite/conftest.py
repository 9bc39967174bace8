"""Every test of the suite on the Django test database (rolled back after each), so EngramStore works."""

import pytest


@pytest.fixture(autouse=True)
def _engram_database(db):
    pass
