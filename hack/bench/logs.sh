#!/usr/bin/env bash
# pod logs -f vs docker logs -f on the same container in the same run: bytes/s delivered, time to first line
#
# One agent, one pod whose container prints LINES (300000) numbered lines of 100 bytes as fast as it can once
# told to. Both followers start before it does, each written straight to a file; each one's rate is its bytes
# over the time from its first to its last byte, and every line must arrive once, in order. Time to first
# line: from starting the command to its first line, on the same container, median of 5, for both. Target:
# pod logs >= 0.9 x docker logs.
# Nothing is asserted; the last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
NODE_PREFIX=benchlogs
source hack/bench-lib.sh
build_hostlet
docker image inspect busybox:latest >/dev/null || { echo "busybox:latest missing: run hack/images.sh" >&2; exit 1; }
LINES="${LINES:-300000}"
WORK="$(mktemp -d /tmp/hostlet-bench-logs.XXXXXX)"
PIDS=()
cleanup() {
  # The agent first: while it runs it would make the pod's containers again.
  cleanup_agents
  docker ps -aq --filter "label=io.hostlet.node=$NODE_PREFIX-1" | xargs -r docker rm -f >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Caps above what the flood writes (~50 MiB as json-file keeps it): a follower that lags loses nothing, so the
# two rates compare like for like. Following across rotations is the test's (tests/pod_access.rs).
start_agent 1 --container-log-max-size=100Mi --container-log-max-files=2
cat >"$WORK/pod.json" <<EOF
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chatty"},
 "spec": {"containers": [{"name": "chatty", "image": "busybox:latest", "command": ["sh", "-c",
   "while [ ! -f /tmp/go ]; do sleep 0.1; done; awk 'BEGIN { pad = sprintf(\"%091d\", 0); for (i = 1; i <= $LINES; i++) printf \"%08d %s\\\\n\", i, pad; print \"DONE\" }'; sleep 3600"]}]}}
EOF
"$HOSTLET" pod apply -f "$WORK/pod.json" --data-dir "$WORK/n1" >/dev/null
deadline=$((SECONDS + 120))
until id=$(docker ps -q --no-trunc --filter "label=io.hostlet.pod=chatty" --filter "label=io.hostlet.node=$NODE_PREFIX-1" --filter "label=io.hostlet.role=app" --filter status=running) && [ -n "$id" ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "pod not running" >&2; tail -20 "$WORK/agent-1.log" >&2; exit 1; }
  sleep 0.2
done

python3 - "$HOSTLET" "$WORK/n1" "$id" "$LINES" "$WORK" <<'PY'
import json, os, statistics, subprocess, sys, threading, time

hostlet, data_dir, cid, lines, work = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
pod_cmd = [hostlet, "pod", "logs", "-f", "chatty", "--data-dir", data_dir]
docker_cmd = ["docker", "logs", "-f", cid]

def follow(cmd, out, path):
    # Straight into a file: no reader of ours in the pipe to slow either follower down.
    with open(path, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL)
    first = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        size = os.path.getsize(path)
        if first is None and size > 0:
            first = time.monotonic()
        if size > 0:
            with open(path, "rb") as f:
                f.seek(max(0, size - 16))
                if b"DONE\n" in f.read():
                    break
        time.sleep(0.001)
    last = time.monotonic()
    p.kill(); p.wait()
    expected = 1; ok = True; total = 0
    with open(path, "rb") as f:
        for line in f:
            total += len(line)
            if line == b"DONE\n":
                break
            if int(line[:8]) != expected:
                ok = False
            expected += 1
    out.update(first=first, last=last, bytes=total, lines=expected - 1, in_order=ok and expected - 1 == lines)

results = {"pod": {}, "docker": {}}
threads = [threading.Thread(target=follow, args=(c, results[k], f"{work}/{k}.out")) for k, c in (("pod", pod_cmd), ("docker", docker_cmd))]
for t in threads: t.start()
time.sleep(1.0)  # both followers attached before the flood
subprocess.run(["docker", "exec", cid, "touch", "/tmp/go"], check=True)
for t in threads: t.join(700)

def rate(r):
    return r["bytes"] / max(r["last"] - r["first"], 1e-9)

def first_line(cmd, n=5):
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        p.stdout.read(1)
        times.append(time.monotonic() - t0)
        p.kill(); p.wait()
    return statistics.median(times)

ttfl_pod = first_line([hostlet, "pod", "logs", "-f", "--tail", "1", "chatty", "--data-dir", data_dir])
ttfl_docker = first_line(["docker", "logs", "-f", "--tail", "1", cid])
pod_rate, docker_rate = rate(results["pod"]), rate(results["docker"])
ratio = pod_rate / docker_rate
print(f"{lines} lines, {results['docker']['bytes'] / 2**20:.1f} MiB through each follower")
print(f"  pod logs -f     {pod_rate / 2**20:8.1f} MiB/s  lines {results['pod']['lines']} in order {results['pod']['in_order']}  first line {ttfl_pod * 1000:.0f} ms")
print(f"  docker logs -f  {docker_rate / 2**20:8.1f} MiB/s  lines {results['docker']['lines']} in order {results['docker']['in_order']}  first line {ttfl_docker * 1000:.0f} ms")
print(f"  ratio {ratio:.2f} (target >= 0.9)")
print(json.dumps({
    "bench": "logs", "lines": lines,
    "pod_logs_bytes_per_s": round(pod_rate), "docker_logs_bytes_per_s": round(docker_rate),
    "ratio": round(ratio, 3), "target_ratio": 0.9,
    "pod_logs_lines": results["pod"]["lines"], "pod_logs_in_order": results["pod"]["in_order"],
    "docker_logs_lines": results["docker"]["lines"], "docker_logs_in_order": results["docker"]["in_order"],
    "pod_logs_first_line_s": round(ttfl_pod, 4), "docker_logs_first_line_s": round(ttfl_docker, 4),
}))
PY
