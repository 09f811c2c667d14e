#!/usr/bin/env python3
"""Draw dashboards/herdguard.json's panels as one SVG, over a short bench-like
run of `herdguard proxy`, without Grafana (it is not packaged where this
project builds; Prometheus is, as Debian's `prometheus`).

    python3 dashboards/picture.py --herdguard target/release/herdguard \
        --out docs/dashboard.svg

What it does, all on 127.0.0.1 and all stopped at the end:
1. starts redis-server, a small origin (in this process), the proxy with
   Redis, an origin budget and a breaker, and Prometheus scraping the
   proxy's /metrics every second;
2. runs about three minutes of load: hot keys that expire every 5 s, a
   burst of 200 concurrent requests on a cold key every 15 s, answers that
   are not stored, Redis frozen for 12 s, the origin answering 503 for 15 s;
3. evaluates every query of the dashboard with Prometheus's own PromQL
   engine ($cache as .*, $__rate_interval as 4 s) and draws each panel at
   its place in the dashboard's grid.

Python's standard library only. Prometheus's data stays in a temporary
directory, removed at the end.
"""

import argparse
import http.client
import http.server
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from html import escape

HERE = os.path.dirname(os.path.abspath(__file__))
RATE_INTERVAL = "4s"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# The origin: cacheable for 5 s after a 150 ms computation; /private and
# /cookie answers are not stored; 503 while `failing` is set.
# --------------------------------------------------------------------------

class Origin(http.server.BaseHTTPRequestHandler):
    failing = threading.Event()
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if Origin.failing.is_set():
            self.answer(503, {"retry-after": "1"}, b"down")
            return
        path = self.path
        if path.startswith("/burst/"):
            time.sleep(0.3)
        else:
            time.sleep(0.15)
        headers = {"cache-control": "max-age=5, stale-if-error=60"}
        if path.startswith("/private/"):
            headers = {"cache-control": "private, max-age=5"}
        elif path.startswith("/cookie/"):
            headers["set-cookie"] = "session=1"
        self.answer(200, headers, b"x" * (512 + hash(path) % 4096))

    def answer(self, status, headers, body):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


# --------------------------------------------------------------------------
# The load
# --------------------------------------------------------------------------

def client_loop(port, stop, paths):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    rnd = random.Random()
    while not stop.is_set():
        try:
            conn.request("GET", rnd.choice(paths)())
            conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            time.sleep(0.05)
        time.sleep(0.002)
    conn.close()


def burst(port, key, n=200):
    def one():
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", f"/burst/{key}")
            c.getresponse().read()
            c.close()
        except (OSError, http.client.HTTPException):
            pass
    gate = threading.Barrier(n)

    def start():
        gate.wait()
        one()
    threads = [threading.Thread(target=start) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_load(port, redis_pid, seconds, log):
    stop = threading.Event()
    rnd = random.Random(7)
    counter = iter(range(10**9))
    paths = (
        [lambda: f"/hot/{rnd.randrange(20)}"] * 12
        + [lambda: f"/cold/{next(counter)}"]
        + [lambda: f"/private/{rnd.randrange(50)}", lambda: f"/cookie/{rnd.randrange(50)}"]
    )
    clients = [threading.Thread(target=client_loop, args=(port, stop, paths)) for _ in range(16)]
    for c in clients:
        c.start()
    t0 = time.time()
    events = {
        15: ("burst", None), 30: ("burst", None), 45: ("burst", None),
        60: ("redis frozen", lambda: os.kill(redis_pid, signal.SIGSTOP)),
        72: ("redis back", lambda: os.kill(redis_pid, signal.SIGCONT)),
        90: ("burst", None),
        105: ("origin 503", Origin.failing.set),
        120: ("origin back", Origin.failing.clear),
        135: ("burst", None), 150: ("burst", None),
    }
    try:
        for at in sorted(events):
            if at >= seconds:
                break
            time.sleep(max(0, t0 + at - time.time()))
            what, act = events[at]
            log(f"{at:4d}s {what}")
            if act:
                act()
            else:
                threading.Thread(target=burst, args=(port, f"k{at}")).start()
        time.sleep(max(0, t0 + seconds - time.time()))
    finally:
        Origin.failing.clear()
        os.kill(redis_pid, signal.SIGCONT)
        stop.set()
        for c in clients:
            c.join()


# --------------------------------------------------------------------------
# Prometheus queries
# --------------------------------------------------------------------------

def query_range(prom, expr, start, end, step=1):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def substitute(expr):
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$cache", ".*")


def legend(fmt, metric):
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(metric.items())) or "value"
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    # A label the series lacks (a zero series registered without it).
    while "{{" in out and "}}" in out:
        out = out[:out.index("{{")] + out[out.index("}}") + 2:]
    return " ".join(out.split()) or "all"


def collect(dashboard, prom, start, end):
    """Each panel with its series: (legend, [(t, value or None)])."""
    panels = []
    for p in dashboard["panels"]:
        entry = {"panel": p, "series": []}
        for t in p.get("targets", []):
            for s in query_range(prom, substitute(t["expr"]), start, end):
                pts = []
                for ts, v in s["values"]:
                    f = float(v)
                    pts.append((float(ts), None if math.isnan(f) or math.isinf(f) else f))
                entry["series"].append((legend(t.get("legendFormat", ""), s["metric"]), pts))
        panels.append(entry)
    return panels


# --------------------------------------------------------------------------
# SVG
# --------------------------------------------------------------------------

PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9",
           "#8ab8ff", "#96d98d", "#ffb357", "#ca95e5"]
UNIT_H = 26
WIDTH = 1560


def fmt_value(v, unit):
    a = abs(v)
    if unit == "s":
        if a == 0:
            return "0"
        if a < 1:
            return f"{v * 1000:.3g} ms"
        return f"{v:.3g} s"
    if unit == "bytes":
        for u, d in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if a >= d:
                return f"{v / d:.3g} {u}"
        return f"{v:.0f} B"
    suffix = {"reqps": "/s", "ops": "/s"}.get(unit, "")
    if a >= 1000:
        return f"{v / 1000:.3g}k{suffix}"
    return f"{v:.3g}{suffix}"


def nice_max(v):
    if v <= 0:
        return 1
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * e:
            return m * e
    return 10 * e


def draw_panel(out, entry, x, y, w, h, t0, t1):
    p = entry["panel"]
    d = p.get("fieldConfig", {}).get("defaults", {})
    unit = d.get("unit", "short")
    stacked = d.get("custom", {}).get("stacking", {}).get("mode") == "normal"
    out.append(f'<rect x="{x + 3}" y="{y + 3}" width="{w - 6}" height="{h - 6}" rx="3" fill="#181b1f" stroke="#2c3235"/>')
    out.append(f'<text x="{x + 12}" y="{y + 22}" class="title">{escape(p["title"])}</text>')
    series = [s for s in entry["series"] if any(v is not None for _, v in s[1])]
    cols = 3 if w > 450 else 2
    legend_rows = max(1, math.ceil(len(series) / cols)) if series else 1
    px, py = x + 58, y + 34
    pw, ph = w - 58 - 16, h - 34 - 14 - legend_rows * 15 - 14
    if stacked and series:
        acc = {}
        stacked_series = []
        for name, pts in series:
            new = []
            for t, v in pts:
                base = acc.get(t, 0.0)
                top = base + (v or 0.0)
                acc[t] = top
                new.append((t, top))
            stacked_series.append((name, new))
        series = stacked_series
    vmax = max([v for _, pts in series for _, v in pts if v is not None] + [0])
    vmin = min([v for _, pts in series for _, v in pts if v is not None] + [0])
    if d.get("max") is not None:
        vmax = max(vmax, d["max"])
    top = nice_max(vmax) if vmax > 0 else 1
    bottom = 0 if vmin >= 0 else -nice_max(-vmin)

    def sx(t):
        return px + (t - t0) / max(1, t1 - t0) * pw

    def sy(v):
        return py + ph - (v - bottom) / (top - bottom) * ph

    for i in range(5):
        v = bottom + (top - bottom) * i / 4
        yy = sy(v)
        out.append(f'<line x1="{px}" y1="{yy:.1f}" x2="{px + pw}" y2="{yy:.1f}" class="grid"/>')
        out.append(f'<text x="{px - 6}" y="{yy + 4:.1f}" class="tick" text-anchor="end">{escape(fmt_value(v, unit))}</text>')
    span = t1 - t0
    step = 30 if span > 120 else 15
    t = 0
    while t <= span:
        xx = sx(t0 + t)
        out.append(f'<line x1="{xx:.1f}" y1="{py}" x2="{xx:.1f}" y2="{py + ph}" class="grid"/>')
        out.append(f'<text x="{xx:.1f}" y="{py + ph + 13}" class="tick" text-anchor="middle">{t}s</text>')
        t += step
    if not series:
        out.append(f'<text x="{px + pw / 2}" y="{py + ph / 2}" class="nodata" text-anchor="middle">0 throughout the run</text>')
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        segs, cur = [], []
        for t, v in pts:
            if v is None:
                if cur:
                    segs.append(cur)
                cur = []
            else:
                cur.append(f"{sx(t):.0f},{sy(v):.0f}")
        if cur:
            segs.append(cur)
        for seg in segs:
            if len(seg) == 1:
                seg = seg * 2
            out.append(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        lx = x + 14 + (i % cols) * ((w - 28) / cols)
        ly = py + ph + 30 + (i // cols) * 15
        out.append(f'<rect x="{lx:.1f}" y="{ly - 8}" width="10" height="3" fill="{color}"/>')
        out.append(f'<text x="{lx + 14:.1f}" y="{ly - 3}" class="legend">{escape(name[:40])}</text>')


def render(dashboard, collected, t0, t1, note):
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    height = bottom * UNIT_H + 50 + len(note) * 15
    col = WIDTH / 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
           "<style>.title{fill:#ccccdc;font-size:13px;font-weight:600}.tick{fill:#8e8e8e;font-size:10px}"
           ".legend{fill:#ccccdc;font-size:10.5px}.row{fill:#ccccdc;font-size:15px;font-weight:600}"
           ".grid{stroke:#2c3235;stroke-width:1}.nodata{fill:#6e6e6e;font-size:12px}.note{fill:#8e8e8e;font-size:11px}</style>",
           f'<rect width="{WIDTH}" height="{height}" fill="#111217"/>',
           f'<text x="12" y="22" class="row">{escape(dashboard["title"])} — cache: All</text>',
           ]
    for i, line in enumerate(note):
        out.append(f'<text x="12" y="{40 + i * 15}" class="note">{escape(line)}</text>')
    top = 44 + len(note) * 15
    for r in rows:
        out.append(f'<text x="12" y="{top + r["gridPos"]["y"] * UNIT_H + 18}" class="row">{escape(r["title"])}</text>')
    for entry in collected:
        p = entry["panel"]
        if p["type"] == "row":
            continue
        g = p["gridPos"]
        draw_panel(out, entry, g["x"] * col, top + g["y"] * UNIT_H, g["w"] * col, g["h"] * UNIT_H, t0, t1)
    out.append("</svg>")
    return "\n".join(out)


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

def wait_port(port, proc, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--herdguard", required=True, help="the herdguard binary")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "dashboard.svg"))
    ap.add_argument("--seconds", type=int, default=165)
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "prometheus")
    args = ap.parse_args()
    with open(os.path.join(HERE, "herdguard.json")) as f:
        dashboard = json.load(f)

    tmp = tempfile.mkdtemp(prefix="herdguard-picture-")
    procs = []
    origin_srv = None
    try:
        def log(msg):
            print(msg, file=sys.stderr, flush=True)

        redis_port, proxy_port, admin_port, prom_port = (free_port() for _ in range(4))
        redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(redis)
        wait_port(redis_port, redis, "redis-server")

        origin_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
        origin_srv.daemon_threads = True
        threading.Thread(target=origin_srv.serve_forever, daemon=True).start()
        origin_port = origin_srv.server_address[1]

        proxy = subprocess.Popen(
            [args.herdguard, "proxy", "--listen", f"127.0.0.1:{proxy_port}",
             "--admin", f"127.0.0.1:{admin_port}", "--upstream", f"http://127.0.0.1:{origin_port}",
             "--redis", f"redis://127.0.0.1:{redis_port}", "--origin-budget", "16",
             "--breaker-failures", "5", "--access-log", "off"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "proxy.log"), "w"))
        procs.append(proxy)
        wait_port(admin_port, proxy, "herdguard proxy")

        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: herdguard\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{admin_port}']\n")
        prom = subprocess.Popen(
            [args.prometheus, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))
        procs.append(prom)
        wait_port(prom_port, prom, "prometheus")
        prom_url = f"http://127.0.0.1:{prom_port}"

        time.sleep(3)
        t0 = time.time()
        log(f"load for {args.seconds} s")
        run_load(proxy_port, redis.pid, args.seconds, log)
        time.sleep(3)
        t1 = t0 + args.seconds + 2

        collected = collect(dashboard, prom_url, t0, t1)
        note = [
            "Not a Grafana screenshot: drawn by dashboards/picture.py from dashboards/herdguard.json's own queries, "
            f"evaluated by Prometheus ({RATE_INTERVAL} rate windows, 1 s scrapes).",
            f"A {args.seconds} s run of herdguard proxy with Redis, all on one 2-core machine: 20 hot keys (max-age 5 s), "
            "bursts of 200 on a cold key at 15, 30, 45, 90, 135, 150 s; Redis frozen 60-72 s; origin answering 503 105-120 s.",
        ]
        svg = render(dashboard, collected, t0, t1, note)
        with open(args.out, "w") as f:
            f.write(svg)
        log(f"wrote {args.out} ({len(svg)} bytes)")
    finally:
        if origin_srv is not None:
            origin_srv.shutdown()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
