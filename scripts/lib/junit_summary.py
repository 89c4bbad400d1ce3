"""The summary of a conformance run, in Markdown, from ginkgo's JUnit report.

    python3 junit_summary.py JUNIT_XML K8S_VERSION SECONDS CONTROL_PLANE WORKERS PROCS

Counts the `[Conformance]` specs that passed, failed and were skipped (the suite's setup and
teardown cases are not specs), and lists each failure with the first lines of its reason.
"""

import datetime
import sys
import xml.etree.ElementTree as ET


def main(path, version, seconds, control_plane, workers, procs):
    cases = ET.parse(path).getroot().iter("testcase")
    specs = [c for c in cases if "[Conformance]" in c.get("name", "")]
    by_status = {}
    for case in specs:
        by_status.setdefault(case.get("status", "unknown"), []).append(case)
    passed = len(by_status.get("passed", []))
    skipped = len(by_status.get("skipped", []))
    # Failed, timed out, panicked, interrupted: each one that did not pass.
    failed = [c for s, cs in by_status.items() if s not in ("passed", "skipped") for c in cs]
    minutes = int(seconds) // 60
    print(f"# Conformance: Kubernetes {version}, {datetime.date.today().isoformat()}")
    print()
    print(f"A cluster of {control_plane} control-plane members and {workers} workers founded by exk8s")
    print(f"on booted machines; {procs} ginkgo processes; {minutes} min {int(seconds) % 60} s.")
    print()
    print("| specs | passed | did not pass | skipped or not run |")
    print("|---|---|---|---|")
    print(f"| {len(specs)} | {passed} | {len(failed)} | {skipped} |")
    if failed:
        print()
        print("## Failed")
        for case in sorted(failed, key=lambda c: c.get("name", "")):
            reason = case.find("failure")
            if reason is None:
                reason = case.find("error")
            text = (reason.get("message") or reason.text or "") if reason is not None else ""
            lines = [line.strip() for line in text.strip().splitlines() if line.strip()][:4]
            print()
            print(f"- **{case.get('name', '').strip()}** ({case.get('status')})")
            for line in lines:
                print(f"  > {line[:300]}")


if __name__ == "__main__":
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    main(*sys.argv[1:])
