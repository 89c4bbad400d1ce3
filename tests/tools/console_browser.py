"""Drives the exk8s console in Debian's Chromium through chromedriver (Selenium), as an operator
would with only a keyboard, and prints what it saw as one JSON document on stdout.

Environment: CONSOLE_URL (the API's base URL), CONSOLE_TOKEN (an operator token), CONSOLE_OURS
(the name of a cluster of that token's org), CONSOLE_THEIRS (another org's cluster id),
CONSOLE_AXE (axe-core's axe.min.js), CONSOLE_SCREENSHOT (where to save the cluster page; the
founding form with the API's refusal goes beside it, `-found.png`), CONSOLE_AGENT (exk8s-agent),
CONSOLE_AGENT_KEYS (the stack's trusted keys) and CONSOLE_AGENT_DIR (where the agent's root and
log go: it boots the node of the cluster founded with the form as on the simulated stack).
Used by tests/tests/console.rs, which judges the result.
"""

import json
import os
import subprocess
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["CONSOLE_URL"]
AXE = open(os.environ["CONSOLE_AXE"], encoding="utf-8").read()

# Axe's own run, its serious and critical violations kept (id, impact, how many nodes).
AXE_RUN = """
const done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']})
  .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.length,
                                          help: v.help}))))
  .catch(e => done([{id: 'axe-error', impact: 'critical', nodes: 0, help: String(e)}]));
"""


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def accessibility(driver):
    """The page's violations as axe-core judges them."""
    driver.execute_script(AXE + "\nwindow.axe = axe;")
    driver.set_script_timeout(30)
    return driver.execute_async_script(AXE_RUN)


def texts(driver, selector):
    """The text of every element `selector` finds, read at once: the live pages may put their
    content in place between two WebDriver calls, which would leave a held element stale."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim());",
        selector)


def node_rows(driver):
    """The cells of the Nodes table (name, VM, role, phase, ...), read at once."""
    return driver.execute_script("""
        const heading = [...document.querySelectorAll('h2')]
            .find(h => h.textContent.trim() === 'Nodes');
        if (!heading) { return []; }
        return [...heading.nextElementSibling.querySelectorAll('tbody tr')]
            .map(r => [...r.children].map(c => c.textContent.trim()));""")


def api(method, path, body):
    """A call of the API with the operator's token, as the CLI makes it; its JSON answer."""
    request = urllib.request.Request(
        URL + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": "Bearer " + os.environ["CONSOLE_TOKEN"],
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status in (200, 201, 202), answer.status
        return json.loads(answer.read())


def leaves_page(driver, act):
    """Runs `act`, which sends the page away (a form sent, a link followed), and returns once
    the next page has loaded: a click or a key returns before the browser has navigated, so
    reading the URL straight after it can still see the old page. The old document is marked
    and the wait lasts until a complete document without the mark answers; a question asked
    while the browser swaps documents can fail in several ways (a stale element, a node that
    "does not belong to the document", a script whose context went away), each only means
    "not yet"."""
    driver.execute_script("document.exk8sLeaving = true;")
    act()
    WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return document.exk8sLeaving !== true && document.readyState === 'complete';"))


def press(driver, *keys):
    """Presses `keys` as a keyboard does: on whatever holds the focus."""
    ActionChains(driver).send_keys(*keys).perform()


def focused(driver, wanted):
    """The focused element, how it reads, and whether it satisfies `wanted`. A live page
    (live.js) may put a copy of its content in place between two questions, moving the focus
    to the focused element's copy: the old reference is then stale, and the copy is asked."""
    for _ in range(10):
        element = driver.switch_to.active_element
        try:
            name = element.get_attribute("id") or element.text or element.tag_name
            return element, name, wanted(element)
        except StaleElementReferenceException:
            continue
    raise AssertionError("the focused element went stale ten times in a row")


def tab_until(driver, wanted, most=15):
    """Presses Tab until the focused element satisfies `wanted`; the elements passed through."""
    passed = []
    for _ in range(most):
        press(driver, Keys.TAB)
        element, name, found = focused(driver, wanted)
        passed.append(name)
        if found:
            return element, passed
    raise AssertionError(f"Tab never reached the element; passed {passed}")


def main():
    seen = {}
    driver = browser()
    try:
        driver.get(URL + "/ui")
        seen["signed_out_url"] = driver.current_url
        seen["axe_login"] = accessibility(driver)
        # A wrong token: the form says why.
        field, _ = tab_until(driver, lambda e: e.get_attribute("id") == "token")
        leaves_page(driver, lambda: field.send_keys("exk8s_op_wrong", Keys.ENTER))
        seen["refused"] = driver.find_element(By.CSS_SELECTOR, "[role=alert]").text
        # The operator's token, typed and sent with the keyboard alone.
        field, passed = tab_until(driver, lambda e: e.get_attribute("id") == "token")
        seen["tab_to_token"] = passed
        leaves_page(driver, lambda: field.send_keys(os.environ["CONSOLE_TOKEN"], Keys.ENTER))
        seen["signed_in_url"] = driver.current_url
        seen["cookie_seen_by_script"] = driver.execute_script("return document.cookie")
        seen["clusters"] = texts(driver, "tbody th a")
        seen["axe_clusters"] = accessibility(driver)
        # The list follows the org: a cluster founded through the API appears on it without a
        # reload.
        driver.execute_script("window.exk8sStayed = true;")
        api("POST", "/clusters", {
            "name": "live", "control_plane_count": 1, "control_plane_image_id": 1,
            "control_plane_instance_type": "dev.small", "subnet_id": 1,
        })
        WebDriverWait(driver, 40).until(lambda d: "live" in texts(d, "tbody th a"))
        seen["list_live_stayed"] = driver.execute_script("return window.exk8sStayed === true;")
        # To the cluster by keyboard: Tab to its link, Enter.
        ours = os.environ["CONSOLE_OURS"]
        tab_until(driver, lambda e: e.text == ours)
        leaves_page(driver, lambda: press(driver, Keys.ENTER))
        seen["cluster_url"] = driver.current_url
        seen["cluster_heading"] = texts(driver, "h1")[0]
        seen["conditions"] = texts(driver, "table:nth-of-type(1) tbody th")
        seen["nodes"] = texts(driver, "table:nth-of-type(2) tbody th")
        seen["changes"] = texts(driver, "table.changes tbody th")
        seen["axe_cluster"] = accessibility(driver)
        driver.save_screenshot(os.environ["CONSOLE_SCREENSHOT"])
        # The page follows the cluster: a change made through the API (its health policy
        # turns remediation off) shows on it without a reload, and keyboard focus stays put.
        driver.execute_script("window.exk8sStayed = true;")
        tab_until(driver, lambda e: e.text == "Clusters")
        cluster_id = driver.current_url.rsplit("/", 1)[1]
        api("PUT", f"/clusters/{cluster_id}/health-policy", {"remediation": False})
        WebDriverWait(driver, 40).until(lambda d: "RemediationOff" in texts(d, "main")[0])
        seen["live_stayed"] = driver.execute_script("return window.exk8sStayed === true;")
        seen["live_updated"] = driver.execute_script("return document.getElementById('main').dataset.updated;")
        seen["live_focus"] = driver.execute_script("return document.activeElement.textContent.trim();")
        # Its certificates' lives, on a timeline.
        driver.get(URL + f"/ui/clusters/{cluster_id}/certificates")
        seen["certificate_groups"] = texts(driver, "caption")
        seen["certificate_bars"] = len(texts(driver, "svg.life"))
        seen["axe_certificates"] = accessibility(driver)
        # Found a cluster with the founding form, by keyboard: sent half-filled first, the
        # API's own refusal is on the form; then completed, the new cluster's page follows
        # its founding.
        driver.get(URL + "/ui/clusters")
        tab_until(driver, lambda e: e.text == "Found a cluster")
        leaves_page(driver, lambda: press(driver, Keys.ENTER))
        seen["found_url"] = driver.current_url
        seen["axe_found"] = accessibility(driver)
        field, _ = tab_until(driver, lambda e: e.get_attribute("id") == "name")
        field.send_keys("made-in-browser")
        tab_until(driver, lambda e: e.tag_name == "button" and e.text == "Found the cluster")
        leaves_page(driver, lambda: press(driver, Keys.ENTER))
        seen["found_refused"] = texts(driver, "[role=alert]")
        seen["found_kept"] = driver.execute_script("return document.getElementById('name').value;")
        seen["found_invalid"] = driver.execute_script(
            "return document.querySelector('[aria-invalid=true]')?.id ?? null;")
        seen["axe_found_refused"] = accessibility(driver)
        driver.save_screenshot(os.environ["CONSOLE_SCREENSHOT"].removesuffix(".png") + "-found.png")
        for name, value in (("control_plane_instance_type", "dev.small"),
                            ("control_plane_image_id", "1")):
            field, _ = tab_until(driver, lambda e, n=name: e.get_attribute("id") == n, most=25)
            field.send_keys(value)
        field, _ = tab_until(driver, lambda e: e.get_attribute("id") == "subnet_id", most=25)
        leaves_page(driver, lambda: field.send_keys("1", Keys.ENTER))
        seen["founded_url"] = driver.current_url
        driver.execute_script("window.exk8sStayed = true;")
        phases = []

        def founded(d):
            phase = texts(d, "h1 .phase")[0]
            if not phases or phases[-1] != phase:
                phases.append(phase)
            return phase == "founded"
        WebDriverWait(driver, 60, poll_frequency=0.2).until(founded)
        seen["founding_phases"] = phases
        seen["founding_stayed"] = driver.execute_script("return window.exk8sStayed === true;")
        # Take a snapshot: the action's page says what happens; with no agent reporting on
        # the dev stack's simulated machines, the API refuses, and the form says why.
        tab_until(driver, lambda e: e.text == "Take a snapshot")
        leaves_page(driver, lambda: press(driver, Keys.ENTER))
        seen["axe_snapshot"] = accessibility(driver)
        tab_until(driver, lambda e: e.tag_name == "button" and e.text == "Take the snapshot")
        leaves_page(driver, lambda: press(driver, Keys.ENTER))
        seen["snapshot_refused"] = texts(driver, "[role=alert]")
        # Its node boots: the agent, run against a directory as on the simulated stack (host
        # actions recorded), reports each phase, and the cluster's page follows it in place.
        driver.get(seen["founded_url"])
        driver.execute_script("window.exk8sStayed = true;")
        vm = node_rows(driver)[0][1]
        directory = os.environ["CONSOLE_AGENT_DIR"]
        with open(os.path.join(directory, f"agent-{vm}.log"), "wb") as log:
            agent = subprocess.Popen(
                [os.environ["CONSOLE_AGENT"], "--keys-dir", os.environ["CONSOLE_AGENT_KEYS"],
                 "run", "--root", os.path.join(directory, f"vm-{vm}"), "--api-url", URL,
                 "--imds-url", f"{URL}/sim/imds/{vm}", "--insecure-http"],
                stdout=log, stderr=log)
        node_phases = []

        def booted(d):
            rows = node_rows(d)
            phase = rows[0][3] if rows else ""
            if phase and (not node_phases or node_phases[-1] != phase):
                node_phases.append(phase)
            return phase.startswith("complete")
        try:
            WebDriverWait(driver, 120, poll_frequency=0.05).until(booted)
        finally:
            seen["agent_status"] = agent.wait(timeout=120)
        seen["node_phases"] = node_phases
        # Each report the agent made is a change the page lists, as it was brought in place.
        seen["node_reports"] = texts(driver, "table.changes tr.change-report td:nth-child(3)")
        seen["node_stayed"] = driver.execute_script("return window.exk8sStayed === true;")
        # With a voter reporting healthy, a snapshot is taken: asked of it, on the page.
        tab_until(driver, lambda e: e.text == "Take a snapshot")
        leaves_page(driver, lambda: press(driver, Keys.ENTER))
        tab_until(driver, lambda e: e.tag_name == "button" and e.text == "Take the snapshot")
        leaves_page(driver, lambda: press(driver, Keys.ENTER))
        seen["snapshot_taken_url"] = driver.current_url
        seen["snapshots"] = driver.execute_script(
            "return [...document.querySelectorAll('table.snapshots tbody tr')]"
            ".map(r => [...r.children].map(c => c.textContent.trim()));")
        # Delete it: the name must be typed.
        made_id = seen["founded_url"].rsplit("/", 1)[1]
        driver.get(URL + f"/ui/clusters/{made_id}/actions/delete")
        field, _ = tab_until(driver, lambda e: e.get_attribute("id") == "confirm")
        leaves_page(driver, lambda: field.send_keys("made-in-browser", Keys.ENTER))
        seen["deleted_url"] = driver.current_url
        seen["after_delete"] = texts(driver, "tbody th a")
        # Another org's cluster does not exist for this operator.
        driver.get(URL + "/ui/clusters/" + os.environ["CONSOLE_THEIRS"])
        seen["theirs"] = driver.find_element(By.TAG_NAME, "h1").text
        # Log out; the pages lead to the login form again.
        logout = driver.find_element(By.CSS_SELECTOR, "form[action='/ui/logout'] button")
        leaves_page(driver, logout.click)
        seen["signed_out_again_url"] = driver.current_url
        driver.get(URL + "/ui/clusters")
        seen["after_logout_url"] = driver.current_url
    finally:
        driver.quit()
    print(json.dumps(seen))


main()
