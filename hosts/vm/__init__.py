"""Run commands inside QEMU VMs booted on the incast kernels (see qemu.py)."""
