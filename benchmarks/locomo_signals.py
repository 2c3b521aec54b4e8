"""Leave-one-conversation-out CV of recall's neighbour and date signals on a locomo_cv dump.

    python benchmarks/locomo_signals.py --cache DIR   (DIR: from `locomo_cv.py dump`)
    python benchmarks/locomo_signals.py --cache DIR --audit [--explore [--dates-only]]

Replays harbor.recall()'s fusion (rrf_k, dense weight), neighbour expansion
among the legs' candidates and the date signal in numpy, then picks, per
held-out conversation, the grid point best on the other four (R@10, then R@5).
``--audit``: the lines behind the shipped defaults (the legs and the hybrid at
every k, plain and cross-validated, per held-out conversation against the better leg; recency held
at each half-life; ``fusion=weighted``). ``--explore``: CV over a wider grid of
recall's existing arguments. CV figures average per held-out conversation: set
them beside a fixed point's mean over the conversations, not beside the pooled
dev figure.
"""

import math
import pickle
import re
import statistics
from datetime import UTC, datetime

import numpy as np

KS = (5, 10, 25)
MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]


def load(cache):
    with open(f"{cache}/locomo-dump.pkl", "rb") as f:
        convs = pickle.load(f)
    try:
        with open(f"{cache}/tsv.pkl", "rb") as f:
            tsv = pickle.load(f)
    except FileNotFoundError:
        tsv = None
    return convs, tsv


def leg_ranks(sorted_vals):
    """rank() over (order by value desc) of values already in that order: ties share a rank.

    locomo_cv.py ranks its legs with this one too."""
    r = np.empty(len(sorted_vals), dtype=np.int64)
    cur = 1
    for i in range(len(sorted_vals)):
        if i > 0 and sorted_vals[i] != sorted_vals[i - 1]:
            cur = i + 1
        r[i] = cur
    return r


def bm25(docs, qterms, n_owner, limit, weights=None, drop_half=False):
    """SQL's BM25 over docs matching any qterm: list of (idx, rank, score)."""
    qs = set(qterms)
    if not qs:
        return []
    match = [i for i, d in enumerate(docs) if qs & d.keys()]
    if not match:
        return []
    df = {t: sum(1 for i in match if t in docs[i]) for t in qs}
    avgdl = max(np.mean([max(len(docs[i]), 1) for i in match]), 1)
    scores = []
    for i in match:
        d = docs[i]
        dl = max(len(d), 1)
        s = 0.0
        for t in qs & d.keys():
            n = df[t]
            if drop_half and n > n_owner / 2:
                continue
            idf = math.log(1 + (max(n_owner, n) - n + 0.5) / (n + 0.5))
            tf = d[t]
            w = 1.0 if weights is None else weights.get(t, 1.0)
            s += w * idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / avgdl))
        scores.append((i, s))
    scores.sort(key=lambda x: -x[1])
    scores = scores[:limit]
    vals = np.array([s for _, s in scores])
    ranks = leg_ranks(vals)
    return [(i, int(r), s) for (i, s), r in zip(scores, ranks, strict=True)]


def month_of(ts):
    d = datetime.fromtimestamp(ts, UTC)
    return d.year, d.month


class Q:
    pass


def prepare(conv, n_cand=50, tsv=None, lex_variant=None):
    ids = conv["ids"]
    n = len(ids)
    pos = {m: i for i, m in enumerate(ids)}
    idrank = np.argsort(np.argsort(np.array(ids)))
    content, ctx, has = conv["content"], conv["context"], conv["has_context"]
    sess = np.array(conv["session"])
    prev = np.full(n, -1)
    nxt = np.full(n, -1)
    for i in range(1, n):
        if sess[i] == sess[i - 1]:
            prev[i] = i - 1
            nxt[i - 1] = i
    vf = conv["valid_from"]
    ym = [month_of(t) for t in vf]
    out = []
    for qi, q in enumerate(conv["questions"]):
        s_c = content @ q["vector"]
        s_x = ctx @ q["vector"]
        o = Q()
        o.evidence = set(q["evidence"])
        o.category = q["category"]
        o.text = q["question"]
        o.dense = {}
        for name, sim in (
            ("nearer", np.where(has, np.maximum(s_c, s_x), s_c)),
            ("mean", np.where(has, (s_c + s_x) / 2, s_c)),
            ("content", s_c),
        ):
            order = np.lexsort((np.array(ids), -sim))[:n_cand]
            rk = np.zeros(n)
            sc = np.full(n, np.nan)
            rk[order] = leg_ranks(sim[order])
            sc[order] = sim[order]
            o.dense[name] = (rk, sc)
        if lex_variant is None:
            lex = [(pos[m], r, s) for m, r, s in q["lexical"] if m in pos][:n_cand]
        else:
            lex = lex_variant(conv, tsv, qi, n_cand)
        lr = np.zeros(n)
        ls = np.full(n, np.nan)
        for i, r, s in lex:
            lr[i] = r
            ls[i] = s
        o.lex = (lr, ls)
        # date signal: months (and year) named in the question
        words = re.findall(r"[a-z]+|\d{4}", q["question"].lower())
        months = {MONTHS.index(w) + 1 for w in words if w in MONTHS}
        years = {int(w) for w in words if w.isdigit()}
        o.months, o.years = months, years
        out.append(o)
    return dict(
        n=n,
        idrank=idrank,
        prev=prev,
        nxt=nxt,
        ym=ym,
        vf=vf,
        age=np.maximum(conv["now"] - vf, 0) / 3600.0,
        dia=conv["dia"],
        qs=out,
    )


def date_match(P, o, slack_days):
    """1 where the memory's date falls in a month the question names (or up to slack days after)."""
    n = P["n"]
    if not o.months and not o.years:
        return None
    m = np.zeros(n)
    for i in range(n):
        t = P["vf"][i]
        for mo in o.months or range(1, 13):
            for y in o.years or {P["ym"][i][0], P["ym"][i][0] - 1}:
                start = datetime(y, mo, 1, tzinfo=UTC).timestamp()
                end = datetime(y + (mo == 12), mo % 12 + 1, 1, tzinfo=UTC).timestamp()
                if start <= t < end + slack_days * 86400:
                    m[i] = 1
    return m


MONC = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


def date_match2(P, o, slack):
    ms = {MONC.index(w) + 1 for w in re.findall(r"\b[A-Z][a-z]+\b", o.text) if w in MONC}
    ys = {int(y) for y in re.findall(r"\b(?:19|20)\d\d\b", o.text)}
    if not ms and not ys:
        return None
    out = np.zeros(P["n"])
    for i, t in enumerate(P["vf"]):
        for tt in (t, t - slack * 86400):
            d = datetime.fromtimestamp(tt, UTC)
            if (not ms or d.month in ms) and (not ys or d.year in ys):
                out[i] = 1
    return out


def rank(p, P, o):
    fusion = p.get("fusion", "rrf")
    dr, ds = o.dense[p.get("vec", "nearer")]
    lr, ls = o.lex
    wd, wl, k = p.get("wd", 0.75), p.get("wl", 1.0), p.get("k", 5)
    if fusion == "rrf":
        dv = np.where(dr > 0, wd / (k + dr), 0.0)
        lv = np.where(lr > 0, wl / (k + lr), 0.0)
    else:

        def mm(x):
            ok = ~np.isnan(x)
            if not ok.any():
                return np.zeros_like(x)
            lo, hi = np.nanmin(x), np.nanmax(x)
            return np.where(ok, 1.0 if hi <= lo else (np.nan_to_num(x) - lo) / (hi - lo), 0.0)

        dv = wd * mm(ds)
        lv = wl * mm(ls)
    rel = dv + lv
    cand = (dr > 0) | (lr > 0)
    nb = p.get("nb", 0.0)
    if nb:
        prv = np.where(P["prev"] >= 0, rel[P["prev"]], 0.0)
        nx = np.where(P["nxt"] >= 0, rel[np.maximum(P["nxt"], 0)], 0.0)
        nx = np.where(P["nxt"] >= 0, nx, 0.0)
        mode = p.get("nbmode", "max")
        inh = (
            np.maximum(prv, nx)
            if mode == "max"
            else (nx if mode == "next" else (prv if mode == "prev" else prv + nx))
        )
        if p.get("nb_cand_only", True):
            inh = np.where(cand, inh, 0.0)
        rel = rel + nb * inh
        cand = cand | (inh > 0)
    score = rel.copy()
    hl = p.get("hl", 4320.0)
    if hl:
        score = score * (1 + 0.5 ** (P["age"] / hl))
    dw = p.get("date", 0.0)
    if dw:
        key = p.get("slack", 0)
        if not hasattr(o, "_dm"):
            o._dm = {}
        if key not in o._dm:
            o._dm[key] = date_match2(P, o, key)
        m = o._dm[key]
        if m is not None:
            score = score * (1 + dw * m)
    score = np.where(cand, score, -1.0)
    order = np.lexsort((P["idrank"], -score))
    order = order[score[order] > 0][:25]
    return order


def evaluate(p, Ps):
    """per conv: {k: [recall]} and category lists"""
    res = []
    for P in Ps:
        r = {k: [] for k in KS}
        cat = []
        for o in P["qs"]:
            top = [P["dia"][i] for i in rank(p, P, o)]
            for k in KS:
                r[k].append(
                    1.0 if not o.evidence else len(o.evidence & set(top[:k])) / len(o.evidence)
                )
            cat.append(o.category)
        r["cat"] = cat
        res.append(r)
    return res


def agg(res, convs_idx, k, cat=None):
    xs = [
        x
        for ci in convs_idx
        for x, c in zip(res[ci][k], res[ci]["cat"], strict=True)
        if cat is None or c == cat
    ]
    return 100 * statistics.mean(xs) if xs else float("nan")


def cv(points, table, nconv=5):
    folds = {k: [] for k in KS}
    chosen = []
    cats = {c: [] for c in range(1, 6)}
    for held in range(nconv):
        train = [c for c in range(nconv) if c != held]
        best = max(
            range(len(points)), key=lambda i: (agg(table[i], train, 10), agg(table[i], train, 5))
        )
        chosen.append(best)
        for k in KS:
            folds[k].append(agg(table[best], [held], k))
        for c in cats:
            cats[c].append((table[best][held][10], table[best][held]["cat"]))
    catm = {}
    for c in cats:
        xs = [x for r, cs in cats[c] for x, cc in zip(r, cs, strict=True) if cc == c]
        catm[c] = 100 * statistics.mean(xs)
    return folds, chosen, catm


def report(label, points, table, nconv=5):
    folds, chosen, catm = cv(points, table, nconv)
    s = " ".join(
        f"R@{k} {statistics.mean(folds[k]):.1f} (sd {statistics.stdev(folds[k]):.1f})" for k in KS
    )
    print(f"CV {label}: {s} | cats@10 " + " ".join(f"{catm[c]:.1f}" for c in range(1, 6)))
    print(
        "   folds@10: "
        + " ".join(f"{x:.1f}" for x in folds[10])
        + " | chose: "
        + "; ".join(str(points[i]) for i in chosen)
    )
    return folds


def plain(label, p, Ps):
    res = evaluate(p, Ps)
    allc = range(len(Ps))
    print(
        f"dev {label}: "
        + " ".join(f"R@{k} {agg(res, allc, k):.1f}" for k in KS)
        + " | cats@10 "
        + " ".join(f"{agg(res, allc, 10, c):.1f}" for c in range(1, 6))
        + " | conv@10 "
        + " ".join(f"{agg(res, [i], 10):.1f}" for i in allc)
    )
    return res


# the shipped defaults (MemoryPolicy / harbor.recall()): rrf, rrf_k 5, dense 0.75, lexical 1,
# neighbour 0.75, date 2, half-life 180 days
SHIPPED = dict(k=5, wd=0.75, wl=1.0, nb=0.75, date=2, hl=4320.0)
# the grid the shipped neighbour and date weights were chosen on
BASE = [dict(k=k, wd=wd) for k in (3, 5, 10) for wd in (0.5, 0.75, 1.0)]
SIGNALS = [dict(nb=n, date=d) for n in (0.5, 0.75, 1.0) for d in (0, 1, 2, 3)]
CATS = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def fixed(res, nconv):
    """A fixed point's R@k per conversation (nothing fitted): {k: [per conversation]}."""
    return {k: [agg(res, [i], k) for i in range(nconv)] for k in KS}


def ms(xs):
    return f"{statistics.mean(xs):.1f} ({statistics.stdev(xs):.1f})"


def cv_row(label, points, Ps, out):
    """CV of the best-on-four point among ``points``; prints and appends a table row."""
    table = [evaluate(p, Ps) for p in points]
    folds, chosen, catm = cv(points, table, len(Ps))
    out.append((label, folds, catm, [points[i] for i in chosen]))
    print(
        f"CV {label}: "
        + " ".join(f"R@{k} {ms(folds[k])}" for k in KS)
        + " | R@10 "
        + " ".join(f"{CATS[c]} {catm[c]:.1f}" for c in CATS)
        + "\n   folds@10 "
        + " ".join(f"{x:.1f}" for x in folds[10])
        + " | chose "
        + "; ".join(
            ",".join(f"{a}={b:g}" if not isinstance(b, str) else f"{a}={b}" for a, b in p.items())
            for p in (points[i] for i in chosen)
        ),
        flush=True,
    )
    return folds


def audit(convs, Ps):
    """The lines behind the shipped defaults: the legs and the hybrid at every k, plain
    dev and cross-validated, recency on and off, fusion=weighted, the old defaults."""
    n = len(Ps)
    allc = range(n)
    print("== plain dev (all five conversations), replay of harbor.recall()")
    named = {
        "dense leg (signals on)": dict(SHIPPED, wl=0.0),
        "lexical leg (signals on)": dict(SHIPPED, wd=0.0),
        "hybrid, shipped": SHIPPED,
        "hybrid, recency off": dict(SHIPPED, hl=0),
        "hybrid, fusion weighted": dict(SHIPPED, fusion="weighted"),
        "hybrid, old defaults (rrf_k 60, 1:1, 168 h, no signals)": dict(
            k=60, wd=1.0, nb=0.0, date=0, hl=168.0
        ),
        "dense leg, recency off": dict(SHIPPED, wl=0.0, hl=0),
        "lexical leg, recency off": dict(SHIPPED, wd=0.0, hl=0),
    }
    per = {}
    for label, p in named.items():
        res = evaluate(p, Ps)
        per[label] = fixed(res, n)
        print(
            f"  {label:58s} "
            + " ".join(f"R@{k} {agg(res, allc, k):.1f}" for k in KS)
            + " | R@10 "
            + " ".join(f"{agg(res, allc, 10, c):.1f}" for c in CATS)
            + " | conv@10 "
            + " ".join(f"{x:.1f}" for x in per[label][10]),
            flush=True,
        )
    print("  (R@10 categories: " + ", ".join(CATS.values()) + ")")
    print("\n== leave-one-conversation-out (fit on four, score the fifth)")
    rows: list = []
    hyb = cv_row(
        "hybrid, rrf (k, dense weight, neighbour, date)",
        [dict(b, **e, hl=4320.0) for b in BASE for e in SIGNALS],
        Ps,
        rows,
    )
    dense, lex = per["dense leg (signals on)"], per["lexical leg (signals on)"]
    print("  legs per held-out conversation (fixed, nothing to fit):")
    for k in KS:
        better = [max(a, b) for a, b in zip(dense[k], lex[k], strict=True)]
        margin = [h - b for h, b in zip(hyb[k], better, strict=True)]
        print(
            f"    R@{k}: dense {ms(dense[k])}, lexical {ms(lex[k])}; hybrid (CV) - better leg"
            f" per fold: "
            + " ".join(f"{x:+.1f}" for x in margin)
            + f" (holds in {sum(x >= 0 for x in margin)} of {n})"
        )
    fx = per["hybrid, shipped"]
    print(
        "  the shipped point itself, per conversation: "
        + " ".join(f"R@{k} {ms(fx[k])}" for k in KS)
    )
    cv_row(
        "hybrid, fusion weighted (dense weight, neighbour, date)",
        [
            dict(fusion="weighted", wd=wd, hl=4320.0, **e)
            for wd in (0.25, 0.5, 0.75, 1.0, 1.5)
            for e in SIGNALS
        ],
        Ps,
        rows,
    )
    print("\n== recency: the same CV with the half-life held at each value")
    for hl in (0, 168.0, 720.0, 2160.0, 4320.0, 8760.0):
        cv_row(
            f"half-life {'off' if not hl else f'{hl:g} h'}",
            [dict(b, **e, hl=hl) for b in BASE for e in SIGNALS],
            Ps,
            rows,
        )
    print(
        "\n  spans: (first session -> now; a fresh turn's factor 2, the oldest's at 168 h / 4320 h)"
    )
    for c, P in zip(convs, Ps, strict=True):
        span_h = float(P["age"].max())
        print(
            f"    {c['sample_id']}: {span_h / 24:.0f} days; oldest turn x"
            f"{1 + 0.5 ** (span_h / 168):.3f} / x{1 + 0.5 ** (span_h / 4320):.3f}"
        )
    return rows


def explore(Ps, dates_only=False):
    """A wider grid of recall's existing arguments (rrf_k, dense weight, neighbour and date
    weights, half-life), each held-out conversation scored with the point best on the others;
    ``dates_only``: the last row alone (the date weight past the wide grid's edge)."""
    rows: list = []
    wide = [
        dict(k=k, wd=wd, nb=nb, date=d, hl=4320.0)
        for k in (1, 2, 3, 5, 8, 10, 20, 60)
        for wd in (0.5, 0.75, 1.0, 1.25)
        for nb in (0.5, 0.75, 1.0, 1.5)
        for d in (1, 2, 3, 4)
    ]
    hls = [
        dict(SHIPPED, hl=hl, nb=nb, date=d)
        for hl in (0, 720.0, 2160.0, 4320.0, 8760.0, 17520.0)
        for nb in (0.5, 0.75, 1.0)
        for d in (2, 3)
    ]
    dates = [dict(SHIPPED, nb=nb, date=d) for nb in (0.75, 1.0, 1.25) for d in (2, 3, 4, 5, 6, 8)]
    grids = [
        ("wide rrf grid (k 1-60, wd 0.5-1.25, nb 0.5-1.5, date 1-4), half-life 180 d", wide),
        ("half-life x neighbour x date at rrf_k 5, wd 0.75", hls),
        ("neighbour x date weight up to 8 at rrf_k 5, wd 0.75, half-life 180 d", dates),
    ]
    for label, points in grids[-1:] if dates_only else grids:
        cv_row(label, points, Ps, rows)
    return rows


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cache", required=True)
    ap.add_argument(
        "--audit",
        action="store_true",
        help="the defaults' evidence: legs and hybrid at every k, plain and CV, recency, weighted",
    )
    ap.add_argument(
        "--explore", action="store_true", help="CV over a wider grid of recall's arguments"
    )
    ap.add_argument("--dates-only", action="store_true", help="with --explore: the date row only")
    args = ap.parse_args()
    convs, _ = load(args.cache)
    Ps = [prepare(c) for c in convs]
    if args.audit or args.explore:
        if args.audit:
            audit(convs, Ps)
        if args.explore:
            explore(Ps, dates_only=args.dates_only)
        return
    plain("lexical", dict(wd=0.0), Ps)
    plain("shipped fusion alone", dict(), Ps)
    plain("shipped (nb 0.75, date 2)", dict(nb=0.75, date=2), Ps)
    base = [dict(k=k, wd=wd) for k in (3, 5, 10) for wd in (0.5, 0.75, 1.0)]
    for label, extra in (
        ("fusion alone", [{}]),
        ("date", [dict(date=d) for d in (0, 1, 2, 3)]),
        ("neighbours", [dict(nb=n) for n in (0, 0.5, 0.75, 1.0)]),
        ("neighbours x date", [dict(nb=n, date=d) for n in (0.5, 0.75, 1.0) for d in (0, 1, 2, 3)]),
    ):
        pts = [dict(b, **e) for b in base for e in extra]
        report(label, pts, [evaluate(p, Ps) for p in pts])


if __name__ == "__main__":
    main()
