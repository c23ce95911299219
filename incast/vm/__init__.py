"""Run commands inside QEMU VMs booted on the incast kernels (see qemu.py): how
`incast run --kernel stock|hrtimer` reaches a kernel other than the machine's."""
