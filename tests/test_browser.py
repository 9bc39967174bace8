"""The /memories/ admin in a real browser (headless Chromium driven by Selenium) against a live server.

Needs Debian's `chromium` and `chromium-driver` (found on PATH, or CHROMIUM_BINARY / CHROMEDRIVER).
Skipped when they are missing, unless ENGRAM_REQUIRE_BROWSER=1 (CI), where a missing browser fails.
Screenshots of every tab (and of a thread's checkpoints) go to test-artifacts/ at the repository root (git-ignored).
"""

import os
import shutil
from pathlib import Path

import pytest

from memory.models import Fact

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = os.environ.get("CHROMIUM_BINARY") or shutil.which("chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
]
PASSWORD = "a long operator password"

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        message = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        if os.environ.get("ENGRAM_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium must not phone home
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("operator", password=PASSWORD, is_staff=True)


def log_in(browser, live_server):
    from selenium.webdriver.common.by import By

    browser.get(f"{live_server.url}/memories/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    assert browser.find_element(By.CSS_SELECTOR, "a.active[role=tab]").text == "Facts"


def test_log_in_open_every_tab_and_delete_three_facts(
    browser, live_server, operator, service, user_factory, demo_workflow
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    ann = user_factory("ann", display_name="Ann")
    service.link_identity(ann.pk, "email", "ann@example.org")
    for n in range(6):
        service.set_fact(f"note_{n}", f"value {n}", scope="user", user_id=ann.pk, fact_type="user_preference")
    episode = service.start_episode(agent_id="planner", user_id=ann.pk, trigger_type="telegram")
    service.complete_episode(episode.pk, success=True, summary="booked a table")
    service.save_procedure("weather", trigger_conditions={"goal_contains": ["weather"]})
    from workflows.graph.runtime import run_workflow

    thread_id = run_workflow(
        demo_workflow, {"type": "chat", "payload": {"user_id": "bea", "message": "hello"}}
    ).thread_id

    log_in(browser, live_server)
    ARTIFACTS.mkdir(exist_ok=True)
    labels = [tab.text for tab in browser.find_elements(By.CSS_SELECTOR, "a[role=tab]")]
    assert labels == [
        "Facts", "Episodes", "Checkpoints", "Procedures", "Store", "Reminders", "Users", "Teams", "Promotions", "Deletions",
        "Health",
    ]  # fmt: skip
    expected_text = {
        "Facts": "note_0",
        "Episodes": "booked a table",
        "Checkpoints": thread_id,
        "Procedures": "weather",
        "Users": "ann@example.org",
    }
    for label in labels:
        browser.find_element(By.ID, f"tab-{label.lower()}").click()
        active = browser.find_element(By.CSS_SELECTOR, "a.active[role=tab]")
        assert active.text == label
        if label in expected_text:
            assert expected_text[label] in browser.find_element(By.ID, "result_list").text
        browser.save_screenshot(str(ARTIFACTS / f"memories-tab-{label.lower()}.png"))

    # A thread's page lists its checkpoints, newest first.
    browser.find_element(By.ID, "tab-checkpoints").click()
    browser.find_element(By.LINK_TEXT, thread_id).click()
    rows = browser.find_elements(By.CSS_SELECTOR, "#thread-checkpoints tbody tr")
    assert rows and all(row.text.startswith(thread_id) for row in rows)
    browser.save_screenshot(str(ARTIFACTS / "memories-thread-checkpoints.png"))

    browser.find_element(By.ID, "tab-facts").click()
    button = browser.find_element(By.ID, "delete-selected")
    assert button.text == "Delete selected (0)" and not button.is_enabled()
    doomed = ["note_1", "note_3", "note_4"]
    for key in doomed:
        row = browser.find_element(By.XPATH, f"//tr[.//a[text()='{key}']]")
        row.find_element(By.CSS_SELECTOR, "input.action-select").click()
    assert button.text == "Delete selected (3)" and button.is_enabled()
    button.click()

    question = WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.ID, "delete-question")))
    assert "Delete these 3 facts?" in question.text
    whose = ann.display_name or ann.canonical_id  # the confirmation names the person, not only user:<id>
    assert set(browser.find_element(By.ID, "delete-sample").text.split("\n")) == {
        f"{k} (user:{ann.pk}) — {whose}" for k in doomed
    }
    browser.save_screenshot(str(ARTIFACTS / "memories-delete-confirmation.png"))
    assert Fact.objects.count() == 6  # nothing deleted before the confirmation
    browser.find_element(By.ID, "confirm-delete").click()

    message = WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist")))
    assert "Deleted 3 facts." in message.text
    listed = browser.find_element(By.ID, "result_list").text
    for key in doomed:
        assert key not in listed
    assert "note_0" in listed and "note_5" in listed
    assert sorted(Fact.objects.values_list("key", flat=True)) == ["note_0", "note_2", "note_5"]
    browser.save_screenshot(str(ARTIFACTS / "memories-after-delete.png"))


def test_a_user_page_and_the_api_docs_in_the_browser(browser, live_server, operator, user_factory, service):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    ann = user_factory("ann", display_name="Ann")
    service.set_fact("favourite_tea", "oolong", scope="user", user_id=ann.pk)
    log_in(browser, live_server)
    browser.find_element(By.ID, "tab-users").click()
    browser.find_element(By.LINK_TEXT, "Ann").click()
    body = browser.find_element(By.ID, "content").text
    assert "Facts (1)" in body and "favourite_tea" in body and "test:ann" in body
    assert browser.find_element(By.ID, "merge-user").is_displayed()
    browser.save_screenshot(str(ARTIFACTS / "memories-user-detail.png"))

    # Swagger UI renders from locally served assets, with the staff session.
    browser.get(f"{live_server.url}/api/docs/")
    WebDriverWait(browser, 15).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".opblock-tag")))
    assert "/api/v1/facts/batch-delete/" in browser.find_element(By.ID, "swagger-ui").text
    browser.save_screenshot(str(ARTIFACTS / "api-docs.png"))
