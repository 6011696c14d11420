"""deploy/monitoring/: the rules pass promtool and name only what artifactd exports.

The series come from the real exporter: the CLI in its own processes runs a
restore that hits (through a node store), one refused as untrusted (a
verify key, an unsigned artifact), one that misses (another workload), a
``status`` after a file was compiled into the restored cache, and a ``gc``
that cannot reach its ``--min-free``; each writes its node-exporter textfile
(``--metrics-file``), parsed here with prometheus-client's own parser. Then:
``promtool check rules`` on the rules; ``promtool test rules`` on the unit
tests in deploy/monitoring/tests/, whose input series must have the names
and label names those textfiles hold; a promtool unit test generated from
those textfiles themselves, whose alerts must fire; and every PromQL
expression of the rules and of the Grafana dashboard names only exported
metrics (or the rules' recorded series) and, in selectors, only their labels.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cachetrees import make_generic_tree
from conftest import REPO, clean_env, run_artifactd
from prometheus_client.parser import text_string_to_metric_families

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "artifactd-rules.yaml"
UNIT_TESTS = sorted((MONITORING / "tests").glob("*.yaml"))
DASHBOARD = MONITORING / "grafana" / "artifactd.json"
#: The labels a scrape adds to every series (node-exporter's textfile collector).
SCRAPE_LABELS = {"instance", "job"}

# PromQL words that are not metric names.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
    "group_right", "bool", "offset", "inf", "nan", "atan2",
}  # fmt: skip


def promtool() -> str:
    """The ``promtool`` on PATH (Debian's prometheus package; scripts/setup.sh installs it)."""
    found = shutil.which("promtool")
    assert found, "no promtool on PATH: scripts/setup.sh installs Debian's prometheus package"
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool; the caller asserts on the result."""
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


@dataclass
class Exported:
    """What the exporter wrote: each textfile's samples, and every name's label names."""

    files: dict[str, list[tuple[str, dict[str, str], float]]]
    labels: dict[str, set[str]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """Textfiles of a real hit, untrusted refusal, miss, compiled-anyway status and short gc."""
    root = tmp_path_factory.mktemp("exporter")
    tree = make_generic_tree(root / "gen")
    env = clean_env({"HOME": str(root / "home"), "ARTIFACTD_GENERIC_DIR": str(tree)})
    store = f"oci:{root / 'store'}"
    prom = root / "textfile"

    def ok(*args: str, extra: dict[str, str] | None = None) -> None:
        proc = run_artifactd(*args, env={**env, **(extra or {})})
        assert proc.returncode == 0, proc.stderr[-2000:]

    ok("harvest", "--store", store, "--family", "generic")
    restore = ("restore", "--store", store, "--family", "generic")
    node = f"oci:{root / 'node'}"
    target = root / "cache"
    ok(*restore, "--node-store", node, "--target", str(target),
       "--metrics-file", str(prom / "hit.prom"))  # fmt: skip
    ok("keygen", "--out", str(root / "key"))
    ok(
        *restore, "--target", str(root / "t2"), "--metrics-file", str(prom / "untrusted.prom"),
        extra={"ARTIFACTD_VERIFY_KEY": str(root / "key.pub")},
    )  # fmt: skip
    # Built for no other GPU: a miss.
    ok(*restore, "--gpu-arch", "sm_80", "--target", str(root / "t3"),
       "--metrics-file", str(prom / "miss.prom"))  # fmt: skip
    (target / "generic" / "compiled-later.cubin").write_bytes(b"\x7fELF")
    ok("status", "--target", str(target), "--metrics-file", str(prom / "status.prom"))
    # A disk can never be 100% free: gc evicts everything and still falls short.
    ok("gc", "--apply", "--store", node, "--max-bytes", "1G", "--min-free", "100",
       "--metrics-file", str(prom / "node.prom"))  # fmt: skip
    files: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    labels: dict[str, set[str]] = {}
    for path in sorted(prom.glob("*.prom")):
        samples = files.setdefault(path.stem, [])
        for family in text_string_to_metric_families(path.read_text()):
            for s in family.samples:
                samples.append((s.name, dict(s.labels), s.value))
                labels.setdefault(s.name, set()).update(s.labels)
    assert set(files) == {"hit", "untrusted", "miss", "status", "node"}, sorted(files)
    return Exported(files, labels)


def recorded_names() -> set[str]:
    """The series the rules file records."""
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def rule_exprs() -> list[tuple[str, str]]:
    """``(rule name, expr)`` of every rule."""
    doc = yaml.safe_load(RULES.read_text())
    return [(r.get("record") or r["alert"], r["expr"]) for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets") or []:
            out.append((panel["title"], target["expr"]))
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_NAME = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(\s*\()?")


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """``(metric, label names matched)`` for every ``metric{...}`` selector in ``expr``."""
    text = _STRING.sub('""', expr)
    return [
        (m.group(1), set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", m.group(2))))
        for m in re.finditer(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", text)
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads: identifiers that are not functions, keywords or labels."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)  # label lists
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names = set()
    for m in _NAME.finditer(text):
        if m.group(2) or m.group(1).lower() in KEYWORDS:
            continue  # a function call, or a keyword
        names.add(m.group(1))
    return names


def test_the_extractor_finds_metrics_and_only_them() -> None:
    expr = (
        'sum by (family, "x") (rate(artifactd_nope_total{kind="a b",job=~"x.*"}[5m] offset 1h))'
        " / on(instance) group_left(pod) artifactd:rec:sum > bool 0.5 or vector(0)"
    )
    assert metric_names(expr) == {"artifactd_nope_total", "artifactd:rec:sum"}
    assert selectors(expr) == [("artifactd_nope_total", {"kind", "job"})]


def test_promtool_checks_the_rules() -> None:
    proc = run_promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in proc.stdout, proc.stdout


def test_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS, "no promtool unit tests in deploy/monitoring/tests"
    proc = run_promtool("test", "rules", *(str(p) for p in UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every alert has a test that fires it.
    fired = set()
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            fired |= {a["alertname"] for a in test.get("alert_rule_test") or [] if a["exp_alerts"]}
    alerts = {name for name, _ in rule_exprs()} - recorded_names()
    assert fired == alerts, f"alerts no unit test fires: {sorted(alerts - fired)}"


def test_the_unit_tests_series_are_what_the_exporter_writes(exported: Exported) -> None:
    checked = 0
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for series in test["input_series"]:
                name, _, body = series["series"].partition("{")
                keys = set(re.findall(r"([A-Za-z_]\w*)=", body))
                assert name in exported.labels, f"{path.name}: {name} is not exported"
                assert keys - SCRAPE_LABELS == exported.labels[name], (
                    f"{path.name}: {series['series']}: the exporter labels {name} with "
                    f"{sorted(exported.labels[name])}"
                )
                checked += 1
    assert checked > 10


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def test_the_alerts_fire_on_the_exporters_own_series(exported: Exported, tmp_path: Path) -> None:
    """Each textfile scraped every minute for an hour, as node-exporter would serve it."""
    series = []
    for stem, samples in exported.files.items():
        for name, labels, value in samples:
            scraped = {**labels, "instance": f"{stem}:9100", "job": "node"}
            series.append({"series": _series(name, scraped), "values": f"{value!r}x60"})
    # The alerts, with the labels that come from artifactd's own (family, failure kind).
    expected = [
        'alertname="ArtifactdCompiledAnyway",family="generic"',
        'alertname="ArtifactdHitRateLow"',
        'alertname="ArtifactdNodeStoreOverHighWater",instance="node:9100"',
        'alertname="ArtifactdUntrustedArtifact",instance="untrusted:9100"',
    ]
    unit = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        # One hit (generic) of three selected: the untrusted and the miss.
                        "expr": "artifactd:restore_hit_ratio",
                        "eval_time": "50m",
                        "exp_samples": [{"labels": "artifactd:restore_hit_ratio", "value": 1 / 3}],
                    },
                    {
                        "expr": "count by (alertname, family, instance) "
                        '(ALERTS{alertstate="firing"})',
                        "eval_time": "50m",
                        "exp_samples": [{"labels": f"{{{a}}}", "value": 1} for a in expected],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "exported-test.yaml"
    path.write_text(yaml.safe_dump(unit))
    proc = run_promtool("test", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _known(exported: Exported) -> set[str]:
    return set(exported.labels) | recorded_names()


@pytest.mark.parametrize(
    ("where", "expr"),
    [(f"rule:{n}", e) for n, e in rule_exprs()] + [(f"panel:{t}", e) for t, e in dashboard_exprs()],
)
def test_every_query_names_exported_metrics_and_labels(
    exported: Exported, where: str, expr: str
) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr!r}"
    unknown = sorted(names - _known(exported))
    assert not unknown, f"{where}: not exported by artifactd: {unknown}"
    for name, keys in selectors(expr):
        if name in exported.labels:
            assert keys <= exported.labels[name] | SCRAPE_LABELS, (
                f"{where}: {name} has no label {sorted(keys - exported.labels[name])}"
            )


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    rules: dict[str, Any] = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:q{i}", "expr": e} for i, (_, e) in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = run_promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
