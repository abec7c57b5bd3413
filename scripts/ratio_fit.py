#!/usr/bin/env python3
"""Fits the tokenizer's ratio on content features and scores every session held out.

Input: the TSV of `cargo run --release --example ratio_probe -- FILE...` (one row per step of the
calibration fit). For one tokenizer generation (`v2`: estimator keys `family/v2`; `v1`: the
others), on the clean steps (those `fidelity --fit` uses), least squares of the recorded growth on
each model's features (no intercept, as the calibration's `scale × bpe + per_block × blocks`);
each session is scored with the fit on the other sessions: Σpredicted − Σrecorded over its clean
steps, and the sum of absolute step errors, both per Σrecorded.

    python3 scripts/ratio_fit.py steps.tsv v2
"""
import sys

MODELS = {
    "bpe+blocks (today)": ["bpe", "blocks"],
    "+chars": ["bpe", "chars", "blocks"],
    "+ws+punct+nonascii": ["bpe", "ws", "punct", "nonascii", "blocks"],
    "+newlines": ["bpe", "newlines", "blocks"],
}


def solve(a, b):
    n = len(a)
    m = [a[i][:] + [b[i]] for i in range(n)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        if abs(m[c][c]) < 1e-12:
            return None
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(rows, feats):
    k = len(feats)
    a = [[0.0] * k for _ in range(k)]
    b = [0.0] * k
    for r in rows:
        x = [r[f] for f in feats]
        for i in range(k):
            b[i] += x[i] * r["recorded"]
            for j in range(k):
                a[i][j] += x[i] * x[j]
    return solve(a, b)


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("v1", "v2"):
        sys.exit("usage: ratio_fit.py STEPS.tsv v1|v2")
    path, generation = sys.argv[1], sys.argv[2]
    rows = []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        for n, line in enumerate(f, start=2):
            cells = line.rstrip("\n").split("\t")
            if len(cells) != len(header):
                sys.exit(f"{path}:{n}: {len(cells)} columns, the header has {len(header)}")
            row = dict(zip(header, cells))
            for name in header[6:]:
                row[name] = float(row[name])
            rows.append(row)
    clean = [r for r in rows if r["clean"] == "1" and ("/v2" in r["key"]) == (generation == "v2")]
    sessions = sorted({r["session"] for r in clean})
    print(f"{generation}: {len(clean)} clean steps of {len(sessions)} sessions")
    print("session                                  steps  Σrecorded      Σbpe  chars/bpe  ws/char  punct/char  newlines/bpe")
    for s in sessions:
        rs = [r for r in clean if r["session"] == s]
        total = {k: sum(r[k] for r in rs) for k in ("recorded", "bpe", "chars", "ws", "punct", "newlines")}
        chars = max(total["chars"], 1.0)
        print(f"{s[:40]:<40} {len(rs):>6} {total['recorded']:>10.0f} {total['bpe']:>9.0f} {total['chars'] / max(total['bpe'], 1):>10.2f} "
              f"{total['ws'] / chars:>8.3f} {total['punct'] / chars:>11.3f} {total['newlines'] / max(total['bpe'], 1):>13.3f}")
    for name, feats in MODELS.items():
        pooled = fit(clean, feats)
        coefficients = ", ".join(f"{f} {c:.4f}" for f, c in zip(feats, pooled)) if pooled else "singular"
        print(f"\n{name}: pooled {coefficients}")
        for s in sessions:
            train = [r for r in clean if r["session"] != s]
            test = [r for r in clean if r["session"] == s]
            c = fit(train, feats)
            if c is None:
                print(f"  {s[:40]:<40} held out: singular")
                continue
            recorded = sum(r["recorded"] for r in test)
            predicted = [sum(r[f] * ci for f, ci in zip(feats, c)) for r in test]
            drift = 100 * (sum(predicted) - recorded) / recorded
            absolute = 100 * sum(abs(r["recorded"] - p) for r, p in zip(test, predicted)) / recorded
            print(f"  {s[:40]:<40} held out: Σ {drift:+6.1f}%   Σ|step error| {absolute:5.1f}%")


if __name__ == "__main__":
    main()
