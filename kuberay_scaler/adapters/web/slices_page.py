"""/debug/slices: the last plan as a page a person reads through a port-forward.

Groups → slices → hosts, each with its state, the reason for it and how long it has been idle,
then what the plan decided for the group and the last decisions that changed something. The
page is rendered from the same document /debug/plan serves (nothing is computed here), every
value escaped, no script, no external resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1a1a1a; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .4em 0 1em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.state { font-weight: 600; border-radius: 3px; padding: 0 .4em; }
.complete { background: #d9f2d9; } .pending { background: #fff3cc; }
.partial { background: #ffe0b3; } .broken { background: #f8c9c9; }
.outdated { background: #e0e0f8; }
.terminating { background: #e0e0e0; }
.avail-available { background: #d9f2d9; } .avail-suspect { background: #fff3cc; }
.avail-unavailable { background: #f8c9c9; }
.queued { background: #dde8ff; }
.held { color: #a15c00; } .muted { color: #666; }
ul { margin: .2em 0 .6em 1.2em; padding: 0; }
"""


def render_slices(document: Mapping[str, Any] | None) -> str:
    """The whole page for one /debug/plan document (None: no plan yet)."""
    if document is None:
        return _page(
            "kuberay-scaler: slices", "<p>No plan yet: the first reconcile has not run.</p>"
        )
    title = f"kuberay-scaler: slices of {document.get('cluster') or '?'}"
    parts = [f"<h1>{escape(title)}</h1>", _summary(document)]
    parts += [_group(g) for g in document.get("groups") or []]
    parts.append(_recent(document.get("recent_decisions") or []))
    return _page(title, "\n".join(parts))


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def _summary(doc: Mapping[str, Any]) -> str:
    lines = []
    held = doc.get("held")
    if held:
        lines.append(f"<p class='held'>Whole plan held: {escape(held.get('text', ''))}</p>")
    if doc.get("last_outcome"):
        lines.append(f"<p>Last outcome: {escape(str(doc['last_outcome']))}</p>")
    problems = [p.get("text", "") for p in doc.get("problems") or []]
    infeasible = [
        f"{i.get('count', 1)}× {i.get('demand', '')}: {i.get('reason', '')}"
        for i in doc.get("infeasible") or []
    ]
    if infeasible:
        lines.append("<p>Infeasible demand:</p>" + _list(infeasible))
    if problems:
        lines.append("<p>Problems:</p>" + _list(problems))
    return "\n".join(lines)


def _group(g: Mapping[str, Any]) -> str:
    replicas = g.get("replicas") or {}
    head = (
        f"<h2 id='group-{escape(str(g.get('name', '')))}'>Group {escape(str(g.get('name', '')))}"
        f" <span class='muted'>({g.get('num_of_hosts', 1)} host(s) per slice; replicas "
        f"{replicas.get('current', '?')} → {replicas.get('target', '?')})</span></h2>"
    )
    held = g.get("held")
    held_line = f"<p class='held'>Held: {escape(held.get('text', ''))}</p>" if held else ""
    reasons = [r.get("text", "") for r in g.get("reasons") or []]
    decided = "<p>Why:</p>" + _list(reasons) if reasons else "<p class='muted'>No reasons.</p>"
    return (
        head
        + _availability(g.get("availability") or {})
        + held_line
        + _rules(g.get("disruption"))
        + _gangs(g.get("gangs") or [])
        + _slices_table(g.get("slices") or [])
        + decided
    )


def _availability(a: Mapping[str, Any]) -> str:
    """The group's availability: its state, what said so, and its next probe."""
    state = str(a.get("state") or "available")
    line = f"Availability: <span class='state avail-{escape(state)}'>{escape(state)}</span>"
    if a.get("text") and state != "available":
        line += f" {escape(str(a['text']))}"
    if a.get("next_probe_at"):
        line += (
            f"; next probe at {escape(str(a['next_probe_at']))}"
            f" (in {_seconds(a.get('next_probe_in_s'))})"
        )
    elif a.get("probing"):
        line += "; probing now (one slice)"
    return f"<p>{line}</p>"


def _gangs(gangs: Sequence[Mapping[str, Any]]) -> str:
    """Pending placement groups' slices here: "gang 4 × v6e-16: 3 up, 1 pending
    4 min, deadline 15 min"."""
    if not gangs:
        return ""
    return "<p>Gangs:</p>" + _list(str(x.get("text", "")) for x in gangs)


def _rules(rules: Mapping[str, Any] | None) -> str:
    """The group's disruption rules, and where each came from (its annotation or the env)."""
    if not rules:
        return ""
    return (
        f"<p class='muted'>Disruption: budget {escape(str(rules.get('budget')))}"
        f" ({escape(str(rules.get('budget_from')))}), {rules.get('leaving', 0)} slice(s) leaving;"
        f" scale-down delay after add {_seconds(rules.get('scale_down_delay_after_add_s'))}"
        f" ({escape(str(rules.get('delay_from')))})</p>"
    )


def _slice_reason(sl: Mapping[str, Any]) -> str:
    notes = [str(sl.get("reason", ""))]
    if sl.get("going"):
        notes.append(f"going (DisruptionTarget {sl['going']})")
    if sl.get("maintenance"):
        notes.append(f"maintenance ({sl['maintenance']})")
    if sl.get("do_not_disrupt"):
        notes.append(f"do-not-disrupt ({sl['do_not_disrupt']})")
    return "; ".join(n for n in notes if n)


def _slices_table(slices: Sequence[Mapping[str, Any]]) -> str:
    if not slices:
        return "<p class='muted'>No slices.</p>"
    rows = []
    for sl in slices:
        hosts = sl.get("hosts") or []
        state = str(sl.get("state", ""))
        first = True
        for host in hosts or [{}]:
            cells = []
            if first:
                span = f" rowspan='{max(1, len(hosts))}'"
                cells += [
                    f"<td{span}>{escape(str(sl.get('slice', '')))}</td>",
                    f"<td{span}><span class='state {escape(state)}'>{escape(state)}</span></td>",
                    f"<td{span}>{escape(_slice_reason(sl))}</td>",
                    f"<td{span}>{_seconds(sl.get('idle_s'))}</td>",
                ]
                first = False
            cells += [
                f"<td>{escape(str(host.get('pod', '')))}</td>",
                f"<td>{escape(str(host.get('phase', '')))}"
                f" {escape(str(host.get('detail', '')))}</td>",
                f"<td>{escape(str(host.get('ray_status') or 'not in Ray'))}</td>",
                f"<td>{_seconds(host.get('idle_s'))}</td>",
            ]
            rows.append("<tr>" + "".join(cells) + "</tr>")
    header = (
        "<tr><th>Slice</th><th>State</th><th>Reason</th><th>Idle</th>"
        "<th>Host pod</th><th>Pod</th><th>Ray node</th><th>Host idle</th></tr>"
    )
    return f"<table>{header}{''.join(rows)}</table>"


def _recent(decisions: Sequence[Mapping[str, Any]]) -> str:
    if not decisions:
        return "<h2>Last decisions</h2><p class='muted'>None yet.</p>"
    rows = [
        "<tr>"
        f"<td>{escape(str(d.get('at', '')))}</td>"
        f"<td>{escape(str(d.get('group', '')))}</td>"
        f"<td>{escape(str(d.get('action', '')))}{' (dry run)' if d.get('dry_run') else ''}</td>"
        f"<td>{escape(str(d.get('replicas', '')))}</td>"
        f"<td>{escape(', '.join(d.get('slices') or []))}</td>"
        f"<td>{escape('; '.join(d.get('reasons') or []))}</td>"
        "</tr>"
        for d in reversed(decisions)
    ]
    header = (
        "<tr><th>When</th><th>Group</th><th>Action</th><th>Replicas</th><th>Slices</th>"
        "<th>Why</th></tr>"
    )
    return f"<h2>Last decisions</h2><table>{header}{''.join(rows)}</table>"


def _list(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def _seconds(value: object) -> str:
    return f"{value:.0f} s" if isinstance(value, int | float) else "–"
