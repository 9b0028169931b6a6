"""The one door to a tenant's files and processes (issue 41, item 4).

Five security passes found the same HIGH in new code: a path into a container that
followed the tenant's symlink, crossed into the tenant's mount, or blocked on the
tenant's server. So every access to a container's filesystem and to `/proc/PID/...`
goes through this package, and `tests/unit/test_one_door.py` fails on any path into
`/proc/<pid>/root`, `fd`, `fdinfo` or `ns/` built anywhere else, and on any signal sent
outside `signals.py`. Its rules:

- **Pinned.** A process is named by a pidfd and an fd of its `/proc/PID` directory,
  taken in that order and checked (`procfs.ProcessDir`): every entry is then opened
  from that directory, which never becomes another process's when the PID is reused.
- **Nothing followed, nothing crossed, unless said.** `resolve.open_at` refuses
  symlinks and other mounts; a call that needs either names why (`follow_symlinks=`,
  `cross_mounts=`).
- **Bounded.** Work that may touch a tenant's filesystem runs in killable children
  with a deadline (`forked`, kept workers in `workers`):
  the scan of open files (`openfiles`), the driver placer (`hotmount/driver/place.py`,
  on fds from `rootdirs`), the setns fallback for device nodes. In the agent's own
  process only what cannot reach one: procfs text printed from kernel memory, and
  device nodes below a `/dev` proven local from procfs, walked with openat2 that
  follows no symlink and enters no mount (`devnodes.Openat2Fs`).
- **Stopping processes**: `signals`, through pidfds only.

Modules: `procfs` (/proc/PID, pinned), `resolve` (openat2), `mounts` (an fd's mount
from procfs), `devnodes` (device nodes), `rootdirs` (directories for the driver's
files), `openfiles` (who holds a device), `signals` (stopping processes).
"""
