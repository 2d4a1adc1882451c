"""The terminal table `python -m fp8eval` prints: both arms' scores, recovery, its CI, the MDE and the verdict
per group, the counts, the sequential stop (stop=sequential) and the overall verdict in words."""

from __future__ import annotations

from fp8eval.control import format_lines as control_lines


def format_table(summary: dict) -> str:
    """A readable recovery table for the terminal."""
    arms = summary["arms"]
    names = list(arms)
    rec = summary.get("recovery") or {}
    groups: list[str] = []
    for a in arms.values():
        for g in a["by_group"]:
            if g not in groups:
                groups.append(g)

    def fmt(x, pct=False):
        if x is None:
            return "-"
        return f"{x:.1f}%" if pct else f"{x:.3f}"

    ver = summary.get("verdict") or {}
    lv = f"{100 * (ver.get('settings') or {}).get('level', 0.95):g}% CI"
    header = ["group"] + names + (["recovery"] if rec else []) + ([lv, "MDE pts", "verdict"] if ver else [])

    def judged(e: dict | None) -> list[str]:
        if not ver:
            return []
        if not e:
            return ["-", "-", "-"]
        hi = "inf" if e.get("ci_high") is None else f"{e['ci_high']:.1f}"
        ci = "-" if e.get("ci_low") is None else f"{e['ci_low']:.1f}-{hi}%"
        return [ci, fmt(e.get("mde_pts")) if e.get("mde_pts") is None else f"{e['mde_pts']:.1f}", e["verdict"]]

    n_pairs = rec.get("n_pairs")  # recovery is over pairs scored in both arms: say how many
    overall = fmt(rec.get("overall"), True) + (f" ({n_pairs} pairs)" if n_pairs is not None else "")
    rows = [["overall"] + [f"{fmt(arms[n]['score'])} ± {fmt(arms[n]['stderr'])}" for n in names]
            + ([overall] if rec else []) + judged(ver.get("overall"))]
    for g in groups:
        rows.append([g] + [fmt(arms[n]["by_group"].get(g)) for n in names]
                    + ([fmt(rec.get("by_group", {}).get(g), True)] if rec else [])
                    + judged((ver.get("by_group") or {}).get(g)))
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    out = [f"{summary['task']} on {summary['model']}", line(header), line(["-" * w for w in widths])]
    if summary.get("dummy_weights"):  # model.dummy=true: random weights, every score meaningless
        out.insert(0, f"*** {summary.get('accuracy_note')} ***")
    out += [line(r) for r in rows]
    extra = []
    for n in names:
        a = arms[n]
        extra.append(f"{n}: n_samples={a['n_samples']} n_repeats={a['n_repeats']} skipped={a['n_skipped']} "
                     f"errors={a['n_errors']} length_cutoff={fmt(a['length_cutoff_rate'])} "
                     f"requests_sent={a['requests_sent']}")
    if rec and n_pairs is not None and any(arms[n].get("n_scored") != n_pairs for n in names):
        excluded = ", ".join(f"{k}={v}" for k, v in (rec.get("excluded") or {}).items())
        own = ", ".join(f"{n}: {arms[n].get('n_scored')}" for n in names)
        extra.append(f"recovery is over the {n_pairs} (sample, repeat) pairs scored in both arms; each arm's score "
                     f"is over its own scored records ({own})" + (f"; pairs left out: {excluded}" if excluded else ""))
    seq = summary.get("sequential")
    if seq:
        extra.append(f"sequential: {seq['decision']} after {seq['rounds']} round(s), {seq['samples_sent']} of"
                     f" {seq['samples_planned']} samples sent; " + ", ".join(
                         f"{b} {v['decision']} ({v['samples_sent']}/{v['samples_planned']})"
                         for b, v in seq["buckets"].items()))
    if ver.get("overall"):
        gate = (ver.get("settings") or {}).get("gate")
        dec = ver.get("decision") or {}
        if dec.get("by") == "sequential":  # the run's one decision; the fixed-n line is descriptive
            extra.append(f"decision (gate {gate:g}%): {dec['verdict']}: {dec['why']}")
            extra.append(f"fixed-n CI over the samples sent (descriptive): {ver['overall']['why']}")
        else:
            extra.append(f"verdict (gate {gate:g}%): {ver['overall']['verdict']}: {ver['overall']['why']}")
    return "\n".join(out + [""] + extra + control_lines(summary))  # control=<name>: flips and the excess
