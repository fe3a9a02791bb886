"""The OCI driver's adapters: the runtime's command line, a machine's rootfs mounts, its
network namespace, its cgroup, and the host-wide claims on user-id ranges and addresses."""
