#!/usr/bin/env bash
# The main job on this machine: hot-mount a device into a running runc container, show
# access denied before and granted after, then take it away again. Needs root.
# With an NVIDIA driver loaded it mounts GPU 0; without one, a stand-in device:
# 195:0 with no driver behind it answers ENXIO once granted, EPERM while denied.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it creates a container and grants devices)" >&2; exit 1; }
[ -n "${HOTMOUNT_SKIP_SETUP:-}" ] || bash scripts/setup.sh  # the README test sets it
PY=$PWD/.venv/bin/python

work=$(mktemp -d /tmp/hotmount-demo.XXXXXX)
id=$($PY -c 'import secrets; print(secrets.token_hex(32))')
cleanup() {
  runc --root "$work/runc" kill "$id" KILL >/dev/null 2>&1 || true
  sleep 0.2
  runc --root "$work/runc" delete --force "$id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/bundle/rootfs/bin" "$work/cdi"
cp "$(command -v busybox)" "$work/bundle/rootfs/bin/busybox"
for applet in sh ls cat sleep; do ln -s busybox "$work/bundle/rootfs/bin/$applet"; done
(cd "$work/bundle" && runc spec)
$PY - "$work/bundle/config.json" <<'PYEOF'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config["process"].update(terminal=False, args=["sleep", "100000"])
json.dump(config, open(path, "w"))
PYEOF

if ls /proc/driver/nvidia/gpus/*/information >/dev/null 2>&1; then
  device=0; node=/dev/nvidia$(awk '/Device Minor/ {print $3; exit}' /proc/driver/nvidia/gpus/*/information)
  echo "== NVIDIA driver found: mounting GPU 0 ($node)"
else
  device=nvidia.com/gpu=0; node=/dev/nvidia0
  cat > "$work/cdi/stand-in.yaml" <<'YAML'
cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl, type: c, major: 195, minor: 255}]
YAML
  echo "== no NVIDIA driver: using a stand-in GPU ($node = 195:0, no driver behind it)"
fi

hotmount() { $PY -m hotmount "$@" --cdi-dir "$work/cdi" --state-dir "$work/state"; }
try_open() {
  runc --root "$work/runc" exec "$id" sh -c "[ -e $node ] || { echo '$node: not there'; exit 0; }; exec 3<>$node && echo '$node: opened'" 2>&1 | sed 's/^/   /' || true
}

(cd "$work/bundle" && runc --root "$work/runc" run -d "$id" >/dev/null 2>&1 </dev/null)
echo "== container $id is running (cgroup: $(hotmount status --container "$id" -o json >/dev/null && echo ok))"
echo "== before: the container opens $node"
try_open
echo "== a device node made by hand is refused by the cgroup:"
nsenter -t "$(runc --root "$work/runc" state "$id" | $PY -c 'import json,sys; print(json.load(sys.stdin)["pid"])')" -m /bin/busybox mknod /dev/hm-probe c 195 0 2>/dev/null || true
runc --root "$work/runc" exec "$id" sh -c 'exec 3<>/dev/hm-probe' 2>&1 | sed 's/^/   /' || true

echo "== python -m hotmount mount --container $id --device $device"
hotmount mount --container "$id" --device "$device"
echo "== after: (ENXIO = 'No such device or address' means the cgroup let it through)"
try_open
hotmount status --container "$id" -o json | $PY -c 'import json,sys; s=json.load(sys.stdin); [print("   ", n["path"], n["state"], "granted" if n["granted"] else "DENIED") for d in s["devices"] for n in d["nodes"]]'

echo "== python -m hotmount unmount --container $id --device $device"
hotmount unmount --container "$id" --device "$device"
echo "== after unmount:"
try_open
runc --root "$work/runc" exec "$id" sh -c 'exec 3<>/dev/hm-probe' 2>&1 | sed 's/^/   /' || true
echo "== the container kept running the whole time: $(runc --root "$work/runc" state "$id" | $PY -c 'import json,sys; print(json.load(sys.stdin)["status"])')"
