#!/bin/bash
# Suspend and resume on a real GPU (issue 33 item 6; docs/api.md, "Suspend and resume"),
# run by scripts/gpu-check.sh in its container, or alone in any running runc container
# that sees the host's python3 with PyTorch (gpu-check.sh's does):
#
#   sudo PYTHONPATH=$PWD bash scripts/gpu-check-suspend.sh RUNC_CONTAINER [GPU [OTHER]]
#
# GPU 0 (or GPU) is hot-mounted into the container; a PyTorch process there fills
# $SUSPEND_GIB GiB (default 4) of GPU memory with a known pattern; hotmount's engine
# suspends the container's GPU (the node's own libcuda.so.1: driver 550 or later), and
# nvidia-smi must show no process on the GPU and its memory back to what it was before
# the process started; the engine resumes, and the process checks every element by a
# kernel on the GPU. Both steps are timed per GiB moved (NVML's count: the tensor and the
# CUDA context). Each step that fails prints "FAIL: ..." and the run ends with exit 1 and
# "suspend/resume check: FAILED"; only a run where every step held says "passed".
# With OTHER (a runc container with /usr/local/bin/cuda-alloc, as gpu-check.sh's plain
# one has), the GPU freed by the suspend serves OTHER before the resume, the on-demand
# hand-over (docs/notebooks.md): mounted there with its driver ($DRIVER_ROOT, default /),
# a 256 MiB allocation
# runs, then it is unmounted, and the suspended process resumes onto the same GPU.
set -u -o pipefail
NAME=${1:?usage: gpu-check-suspend.sh RUNC_CONTAINER [GPU [OTHER]]}
GPU=${2:-0}
OTHER=${3:-}
GIB=${SUSPEND_GIB:-4}
SLACK_MIB=${SUSPEND_SLACK_MIB:-64}  # nvidia-smi's used memory may differ by this much
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENGINE="python3 -m hotmount"
HELPER=$REPO/scripts/gpu_check_suspend.py
STATUS=/tmp/suspend-check.status GO=/tmp/suspend-check.go  # inside the container
export PYTHONPATH=${PYTHONPATH:-$REPO}
FAILED=0 WORKER=""
step() { echo; echo "=== $*"; }
fail() { echo "FAIL: $*"; FAILED=1; }
inside() { runc exec "$NAME" "$@"; }
finish() {
  [ -n "$WORKER" ] && kill -9 "$WORKER" 2>/dev/null
  (cd "$REPO" && $ENGINE unmount --container "pid:$PID" --device "$GPU" --force >/dev/null 2>&1)
  if [ "$FAILED" = 0 ]; then echo "suspend/resume check: passed"; exit 0; fi
  echo "suspend/resume check: FAILED"; exit 1
}
# An abort: the steps after this one would mean nothing.
die() { fail "$*"; finish; }
used_mib() { nvidia-smi -i "$GPU" --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' '; }
apps() { nvidia-smi -i "$GPU" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; }
# Each engine call: one JSON line, its seconds and the bytes moved, or its error.
engine() {
  local out; out=$(cd "$REPO" && python3 "$HELPER" engine "$1" "pid:$PID" 2>&1)
  local rc=$?; echo "$out" | tail -1 > "/tmp/suspend-check.$1.json"; echo "$out"
  return $rc
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, d))' "$@"; }
per_gib() { awk -v s="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f s/GiB", s / (b / 1073741824); else print "n/a (0 bytes)" }'; }
worker_status() { inside cat "$STATUS" 2>/dev/null; }
wait_status() {  # until the worker's status starts with one of the words given, or 120 s
  local deadline=$((SECONDS + 120)) line
  while [ $SECONDS -lt $deadline ]; do
    line=$(worker_status); for word in "$@" ERROR; do
      case "$line" in "$word"*) echo "$line"; return 0;; esac; done
    sleep 0.2
  done
  echo "${line:-no status}"; return 1
}

step "suspend and resume: the container and its GPU"
PID=$(runc state "$NAME" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null)
[ -n "$PID" ] || { PID=0; die "no running runc container $NAME"; }
echo "container $NAME, pid $PID; GPU $GPU; $GIB GiB to fill"
BUSY=$(apps) || die "nvidia-smi cannot list GPU $GPU's processes"
[ -z "$BUSY" ] || die "GPU $GPU has compute processes before the check: $BUSY"
number() { case "$1" in ''|*[!0-9]*) return 1;; esac; }
BASE=$(used_mib); number "$BASE" || die "nvidia-smi cannot read GPU $GPU's memory: ${BASE:-nothing}"
echo "GPU $GPU memory used with no process: $BASE MiB"
(cd "$REPO" && $ENGINE mount --container "pid:$PID" --device "$GPU" -o json) >/dev/null \
  || die "the engine could not mount GPU $GPU"
inside rm -f "$STATUS" "$GO"

step "a PyTorch process fills $GIB GiB of GPU memory"
runc exec -d "$NAME" python3 -c "$(cat "$HELPER")" worker "$GIB" "$STATUS" "$GO" </dev/null >/dev/null 2>&1 \
  || die "could not start the worker in $NAME"
READY=$(wait_status ready) || die "the worker never got ready: $READY"
case "$READY" in ready*) ;; *) die "the worker failed: $READY";; esac
echo "worker: $READY"
WORKER=$(apps | awk -F', *' 'NR == 1 { print $1 }')
[ -n "$WORKER" ] || die "nvidia-smi shows no process on GPU $GPU while the worker holds $GIB GiB"
FILLED=$(used_mib); number "$FILLED" || die "nvidia-smi cannot read GPU $GPU's memory"
echo "nvidia-smi: worker host pid $WORKER; GPU memory used $FILLED MiB"
[ "$FILLED" -ge $((BASE + GIB * 1024 * 9 / 10)) ] \
  || fail "GPU memory used $FILLED MiB, expected at least $BASE + 0.9 x $GIB GiB"

step "engine: suspend"
engine suspend || die "the suspend failed"
SUSPEND_S=$(field /tmp/suspend-check.suspend.json seconds)
SUSPEND_B=$(field /tmp/suspend-check.suspend.json 'ok["hostBytes"]')
echo "suspend: ${SUSPEND_S} s for $((SUSPEND_B >> 20)) MiB: $(per_gib "$SUSPEND_S" "$SUSPEND_B")"
[ "$(field /tmp/suspend-check.suspend.json 'len(ok["processes"])')" -ge 1 ] \
  || fail "the suspend checkpointed no process"
LEFT=$(apps) || die "nvidia-smi cannot list GPU $GPU's processes"
AFTER=$(used_mib); number "$AFTER" || die "nvidia-smi cannot read GPU $GPU's memory"
echo "nvidia-smi after the suspend: processes [${LEFT}], memory used $AFTER MiB (before the worker: $BASE)"
[ -z "$LEFT" ] || fail "nvidia-smi still shows a process on GPU $GPU after the suspend: $LEFT"
[ "$AFTER" -le $((BASE + SLACK_MIB)) ] \
  || fail "GPU $GPU memory not free after the suspend: $AFTER MiB used, $BASE before the worker"
inside sh -c 'ls /dev/nvidia* 2>&1' | grep -q "nvidia$GPU\$" \
  && fail "/dev/nvidia$GPU is still in the container after the suspend"
[ "$(worker_status)" = "$READY" ] || fail "the worker changed while suspended: $(worker_status)"

if [ -n "$OTHER" ]; then
  step "while suspended, the freed GPU $GPU serves $OTHER (an on-demand hand-over)"
  OTHER_PID=$(runc state "$OTHER" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null)
  if [ -z "$OTHER_PID" ]; then fail "no running runc container $OTHER"; else
    (cd "$REPO" && $ENGINE mount --container "pid:$OTHER_PID" --device "$GPU" --with-driver \
      --driver-root "${DRIVER_ROOT:-/}" > /tmp/suspend-check.other.out) || fail "the engine could not mount GPU $GPU into $OTHER"
    grep '^export ' /tmp/suspend-check.other.out > /tmp/suspend-check.other.env
    OTHER_SAYS=$(runc exec "$OTHER" sh -c ". /dev/stdin; cuda-alloc" < /tmp/suspend-check.other.env 2>&1)
    echo "$OTHER: $OTHER_SAYS"
    case "$OTHER_SAYS" in "cuda ok"*) ;; *) fail "$OTHER could not allocate on the freed GPU $GPU";; esac
    (cd "$REPO" && $ENGINE unmount --container "pid:$OTHER_PID" --device "$GPU" >/dev/null) \
      || fail "the engine could not unmount GPU $GPU from $OTHER"
    OTHER_LEFT=$(apps); [ -z "$OTHER_LEFT" ] || fail "a process stays on GPU $GPU after $OTHER's turn: $OTHER_LEFT"
  fi
fi

step "engine: resume"
engine resume || die "the resume failed"
RESUME_S=$(field /tmp/suspend-check.resume.json seconds)
RESUMED=$(field /tmp/suspend-check.resume.json 'ok["resumed"]')
echo "resume: ${RESUME_S} s: $(per_gib "$RESUME_S" "$SUSPEND_B") (onto $RESUMED)"
inside touch "$GO"
VERDICT=$(wait_status intact CORRUPT) || die "the worker did not check its memory: $VERDICT"
echo "worker: $VERDICT"
case "$VERDICT" in intact*) ;; *) fail "the memory did not come back intact: $VERDICT";; esac
BACK=$(apps) || fail "nvidia-smi cannot list GPU $GPU's processes after the resume"
echo "nvidia-smi after the resume: processes [$BACK], memory used $(used_mib) MiB"
echo "$BACK" | grep -q "^$WORKER," || fail "nvidia-smi does not show the worker ($WORKER) back on GPU $GPU"

step "suspend and resume per GiB (GPU $GPU, $((SUSPEND_B >> 20)) MiB moved)"
echo "suspend $(per_gib "$SUSPEND_S" "$SUSPEND_B"), resume $(per_gib "$RESUME_S" "$SUSPEND_B")"
finish
