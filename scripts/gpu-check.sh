#!/bin/bash
# The real GPU check (docs/testing.md, "On a machine with a real GPU"), for a machine with an
# NVIDIA GPU, its driver, runc and root: a runc container started with no GPU nodes;
# the engine hot-mounts GPU 0; nvidia-smi and a 256 MiB CUDA allocation (PyTorch) run
# inside; a process inside holds the GPU, so unmount refuses (exit 3) and --force stops
# it; after the unmount nvidia-smi fails again and a node made by hand is refused.
# Then a second container from a plain image (busybox and glibc, no NVIDIA file at all)
# gets GPU 0 with --with-driver --driver-root / (docs/driver.md): nvidia-smi and a
# 256 MiB allocation through the driver API (a small C program that dlopens libcuda.so.1)
# run inside, and are gone after the unmount. Needs gcc and busybox too. Last, the
# suspend and resume run (scripts/gpu-check-suspend.sh) in the first container: a
# PyTorch process's GPU memory goes to host memory and back, timed per GiB, and while it
# is suspended the plain container borrows the GPU (the on-demand hand-over); its failure
# is this script's exit status.
#
#   sudo PYTHONPATH=$PWD bash scripts/gpu-check.sh     # python3 with torch, pydantic, pynvml
#
# It prints what it sees; read it (CI has no GPU, so this is not a test CI runs).
set -u
REPO=$PWD
step() { echo; echo "=== $*"; }
ENGINE="python3 -m hotmount"

step "machine"
uname -r; nvidia-smi -L; command -v nvidia-smi python3; python3 -V
stat -fc 'cgroup fs: %T' /sys/fs/cgroup; ls -l /dev/nvidia* 2>&1
grep -E 'nvidia' /proc/devices; ls /proc/driver/nvidia/gpus 2>&1
readlink -f "$(command -v python3)"; runc --version | head -1

step "engine inventory (NVML)"
$ENGINE devices -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps(d, indent=1)[:1500])'

step "a runc container with no GPU nodes"
runc delete -f gpucheck >/dev/null 2>&1
trap 'runc delete -f gpucheck >/dev/null 2>&1' EXIT
B=/tmp/gpucheck; rm -rf $B; mkdir -p $B/rootfs; cd $B
runc spec
for d in bin sbin lib lib64 lib32 libx32; do
  if [ -L /$d ]; then ln -s "$(readlink /$d)" rootfs/$d; fi
done
NVBIN=$(dirname "$(command -v nvidia-smi)")
python3 - "$NVBIN" <<'EOF'
import json, os, sys
c = json.load(open("config.json"))
c["process"]["terminal"] = False
c["process"]["args"] = ["sleep", "100000"]
path = f"{sys.argv[1]}:{os.environ['PATH']}:/usr/local/nvidia/bin:/usr/sbin:/usr/bin:/sbin:/bin"
c["process"]["env"] = [f"PATH={path}", "HOME=/tmp",
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib"]
c["root"] = {"path": "rootfs", "readonly": False}
for d in ("/usr", "/etc", "/opt", "/root", "/bin", "/sbin", "/lib", "/lib64"):
    if os.path.isdir(d) and not os.path.islink(d):
        c["mounts"].append({"destination": d, "type": "bind", "source": d,
                            "options": ["rbind", "ro"]})
c["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "nodev", "mode=1777"]})
c["linux"]["cgroupsPath"] = "/gpucheck"
c["linux"].pop("seccomp", None)
json.dump(c, open("config.json", "w"), indent=1)
EOF
runc run -d gpucheck </dev/null >/dev/null 2>$B/run.err || { cat $B/run.err; exit 1; }
PID=$(runc state gpucheck | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
echo "container pid $PID, cgroup: $(cat /proc/$PID/cgroup)"
inside() { runc exec gpucheck "$@"; }
TORCH=$(readlink -f "$(command -v python3)")
CUDA_ALLOC='import torch; x = torch.ones(1 << 26, device="cuda"); print("cuda ok:", torch.cuda.get_device_name(0), float(x.sum()))'

step "before the mount: no GPU in the container"
inside sh -c 'ls -l /dev/nvidia* 2>&1'; inside nvidia-smi -L; echo "nvidia-smi rc=$?"
inside python3 -c 'import torch; print("cuda available:", torch.cuda.is_available())' 2>&1 | tail -1

step "engine: mount GPU 0"
cd $REPO
time $ENGINE mount --container pid:$PID --device 0 -o json; echo "mount rc=$?"
step "after the mount"
inside sh -c 'ls -l /dev/nvidia*'
inside nvidia-smi -L; echo "nvidia-smi rc=$?"
inside nvidia-smi --query-gpu=name,uuid,memory.total --format=csv
inside python3 -c "$CUDA_ALLOC"; echo "cuda alloc rc=$?"

step "a process in the container holds the GPU: unmount refuses, --force stops it"
runc exec -d gpucheck python3 -c 'import torch, time; x = torch.ones(1 << 20, device="cuda"); time.sleep(600)' </dev/null >/dev/null 2>&1
for i in $(seq 60); do
  HOLDER=$(for p in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(readlink /proc/$p/ns/mnt 2>/dev/null)" = "$(readlink /proc/$PID/ns/mnt)" ] || continue
    ls -l /proc/$p/fd 2>/dev/null | grep -q '/dev/nvidia0' && echo $p; done | head -1)
  [ -n "$HOLDER" ] && break; sleep 1
done
echo "holder pid on the host: ${HOLDER:-none found}"
$ENGINE unmount --container pid:$PID --device 0; echo "unmount (held) rc=$? (3 = busy)"
inside nvidia-smi -L; echo "still mounted: nvidia-smi rc=$?"
$ENGINE unmount --container pid:$PID --device 0 --force -o json; echo "unmount --force rc=$?"
if [ -n "${HOLDER:-}" ]; then  # the container's init (sleep) reaps nobody: a zombie is gone
  for i in $(seq 20); do
    state=$(awk '{print $3}' /proc/$HOLDER/stat 2>/dev/null)
    [ -z "$state" ] || [ "$state" = Z ] && break; sleep 0.25
  done
  [ -z "$state" ] || [ "$state" = Z ] && echo "holder stopped" || echo "holder still running ($state)"
fi

step "after the unmount: no GPU again"
inside sh -c 'ls -l /dev/nvidia* 2>&1'; inside nvidia-smi -L; echo "nvidia-smi rc=$?"
inside python3 -c 'import torch; print("cuda available:", torch.cuda.is_available())' 2>&1 | tail -1
step "a node made by hand in the container is refused by the device cgroup"
inside sh -c 'mknod /tmp/nv0 c 195 0 && (exec 3<>/tmp/nv0) 2>&1; echo open rc=$?'

step "mount, unmount ${GPU_CHECK_CYCLES:-10} times (engine timings)"
for i in $(seq "${GPU_CHECK_CYCLES:-10}"); do
  s=$(date +%s%N); $ENGINE mount --container pid:$PID --device 0 >/dev/null || echo FAIL
  m=$(date +%s%N); $ENGINE unmount --container pid:$PID --device 0 >/dev/null || echo FAIL
  e=$(date +%s%N); echo "mount $(( (m-s)/1000000 )) ms, unmount $(( (e-m)/1000000 )) ms (each a new python process)"
done
step "and the GPU still works after all that"
$ENGINE mount --container pid:$PID --device 0 >/dev/null; echo "mount rc=$?"
inside python3 -c "$CUDA_ALLOC"; echo "cuda alloc rc=$?"
$ENGINE unmount --container pid:$PID --device 0 >/dev/null; echo "unmount rc=$?"
$ENGINE status -o json

step "a plain image with no NVIDIA file: the driver's files come with --with-driver"
# The driver's root: / where a distribution package installed it, /usr/local/nvidia where
# the node keeps it in its own tree (GKE's layout: bin/ and lib64/ beside each other)
export DRIVER_ROOT=${DRIVER_ROOT:-/}
[ -x /usr/local/nvidia/bin/nvidia-smi ] && [ "$DRIVER_ROOT" = / ] && DRIVER_ROOT=/usr/local/nvidia
echo "driver root: $DRIVER_ROOT"
runc delete -f gpuplain >/dev/null 2>&1
trap 'runc delete -f gpucheck >/dev/null 2>&1; runc delete -f gpuplain >/dev/null 2>&1' EXIT
P=/tmp/gpuplain; rm -rf $P; mkdir -p $P/rootfs/bin $P/rootfs/tmp $P/rootfs/usr/local/bin; cd $P
cp "$(command -v busybox)" rootfs/bin/busybox && for a in sh ls cat sleep; do ln -s busybox rootfs/bin/$a; done
cat > cuda_alloc.c <<'CSRC'
#include <dlfcn.h>
#include <stdio.h>
typedef int (*f_init)(unsigned); typedef int (*f_get)(int *, int);
typedef int (*f_ctx)(void **, unsigned, int); typedef int (*f_alloc)(unsigned long long *, size_t);
int main(void) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cuda) { printf("dlopen: %s\n", dlerror()); return 1; }
  int dev = 0, rc; void *ctx = 0; unsigned long long ptr = 0;
  if ((rc = ((f_init)dlsym(cuda, "cuInit"))(0))) { printf("cuInit %d\n", rc); return 1; }
  if ((rc = ((f_get)dlsym(cuda, "cuDeviceGet"))(&dev, 0))) { printf("cuDeviceGet %d\n", rc); return 1; }
  if ((rc = ((f_ctx)dlsym(cuda, "cuCtxCreate_v2"))(&ctx, 0, dev))) { printf("cuCtxCreate %d\n", rc); return 1; }
  if ((rc = ((f_alloc)dlsym(cuda, "cuMemAlloc_v2"))(&ptr, 256u << 20))) { printf("cuMemAlloc %d\n", rc); return 1; }
  printf("cuda ok: 256 MiB at 0x%llx\n", ptr); return 0;
}
CSRC
gcc -O2 -o rootfs/usr/local/bin/cuda-alloc cuda_alloc.c -ldl || echo "gcc failed: no allocation check"
# glibc where a Debian/Ubuntu image has it (libc, and the libpthread, libdl, libm and
# librt that nvidia-smi links); no NVIDIA library comes along, only libc's own
for lib in $(ldd rootfs/usr/local/bin/cuda-alloc | grep -o '/[^ ]*'); do
  mkdir -p "rootfs$(dirname "$lib")"; cp -L "$lib" "rootfs$lib"
  case "$lib" in */libc.so.6)
    for more in libpthread.so.0 libdl.so.2 libm.so.6 librt.so.1; do
      [ -e "$(dirname "$lib")/$more" ] && cp -L "$(dirname "$lib")/$more" "rootfs$(dirname "$lib")/"
    done;;
  esac
done
find rootfs -name 'libnvidia*' -o -name 'libcuda*' | grep . && echo "NOT PLAIN: NVIDIA files in the image"
runc spec
python3 - <<'PY'
import json
c = json.load(open("config.json"))
c["process"]["terminal"] = False
c["process"]["args"] = ["sleep", "100000"]
c["process"]["env"] = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp"]
c["root"] = {"path": "rootfs", "readonly": False}
c["linux"]["cgroupsPath"] = "/gpuplain"
c["linux"].pop("seccomp", None)
json.dump(c, open("config.json", "w"), indent=1)
PY
runc run -d gpuplain </dev/null >/dev/null 2>$P/run.err || { cat $P/run.err; exit 1; }
PLAIN_PID=$(runc state gpuplain | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
plain() { runc exec gpuplain "$@"; }
plain nvidia-smi -L; echo "before: nvidia-smi rc=$? (not found expected)"
plain cuda-alloc; echo "before: cuda alloc rc=$? (no libcuda.so.1 expected)"
cd $REPO
$ENGINE mount --container pid:$PLAIN_PID --device 0 --with-driver --driver-root "$DRIVER_ROOT" > $P/mount.out
echo "mount --with-driver rc=$?"; cat $P/mount.out
grep '^export ' $P/mount.out > $P/env.sh
plain sh -c ". /dev/stdin; nvidia-smi -L" < $P/env.sh; echo "after: nvidia-smi rc=$?"
plain sh -c ". /dev/stdin; cuda-alloc" < $P/env.sh; echo "after: cuda alloc rc=$?"
$ENGINE unmount --container pid:$PLAIN_PID --device 0 -o json; echo "unmount rc=$?"
plain nvidia-smi -L; echo "after the unmount: nvidia-smi rc=$? (not found expected)"
plain cuda-alloc; echo "after the unmount: cuda alloc rc=$? (no libcuda.so.1 expected)"

step "suspend and resume a PyTorch process's GPU memory (scripts/gpu-check-suspend.sh)"
bash "$REPO/scripts/gpu-check-suspend.sh" gpucheck 0 gpuplain
SUSPEND_RC=$?
echo done
exit $SUSPEND_RC
