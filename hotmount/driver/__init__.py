"""The driver's user-space files (libraries, tools, firmware) for a running container.

`files` (pure) says what to place, from a CDI spec's mounts and hooks or a driver
root; `mountapi` holds the syscalls (open_tree, mount_setattr, move_mount, umount2);
`place` puts files into a container and takes them out again, with the care of
device nodes. See docs/driver.md for the linker reasoning.
"""
