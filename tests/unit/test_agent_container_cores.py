"""The pure cores behind a machine as a container: its OCI config, who it runs as, what it
runs, and how its end is told."""

from __future__ import annotations

import signal

import pytest

from agent.core.exits import describe_exit, describe_returncode
from agent.core.imageuser import BadUser, resolve_user
from agent.core.ocispec import (
    DEFAULT_CAPABILITIES,
    ContainerSpec,
    Identity,
    Limits,
    runtime_config,
)
from agent.core.records import MachineSpec
from agent.core.runplan import NothingToRun, default_port, run_plan, signal_name, stop_signal
from imagecache.api import ImageConfig

PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
          "app:x:1000:1000::/home/app:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = "root:x:0:\nstaff:x:50:app\napp:x:1000:\nweb:x:33:app,other\n"


def spec(**changes: object) -> ContainerSpec:
    base: dict[str, object] = dict(
        hostname="m1", argv=("python3", "app.py"), env=("PORT=8080",), cwd="/srv",
        user=Identity(), rootfs="/x/rootfs", uid_base=1 << 31,
        limits=Limits(memory_bytes=256 << 20, cpus=0.25, pids=1024), cgroups_path="thaw/m1")
    base.update(changes)
    return ContainerSpec(**base)  # type: ignore[arg-type]


def test_a_container_gets_every_namespace_and_root_maps_to_an_unprivileged_range() -> None:
    config = runtime_config(spec())
    kinds = {ns["type"] for ns in config["linux"]["namespaces"]}
    assert kinds == {"pid", "ipc", "uts", "mount", "user", "network", "cgroup"}
    assert config["linux"]["uidMappings"] == [
        {"containerID": 0, "hostID": 1 << 31, "size": 65536}]
    assert config["linux"]["gidMappings"] == config["linux"]["uidMappings"]


def test_limits_are_the_reservation_memory_with_no_swap_cpu_quota_and_pids() -> None:
    resources = runtime_config(spec())["linux"]["resources"]
    assert resources["memory"] == {"limit": 256 << 20, "swap": 256 << 20}
    assert resources["cpu"] == {"quota": 25_000, "period": 100_000}
    assert resources["pids"] == {"limit": 1024}


def test_without_swap_accounting_no_swap_limit_is_asked_for() -> None:
    limits = Limits(memory_bytes=1 << 20, cpus=1, pids=64, swap_accounted=False)
    assert runtime_config(spec(limits=limits))["linux"]["resources"]["memory"] == {
        "limit": 1 << 20}


def test_devices_are_denied_but_the_standard_few() -> None:
    devices = runtime_config(spec())["linux"]["resources"]["devices"]
    assert devices[0] == {"allow": False, "access": "rwm"}
    allowed = {(d["type"], d["major"], d["minor"]) for d in devices[1:]}
    assert ("c", 1, 3) in allowed and ("c", 1, 9) in allowed  # null, urandom
    assert not any(d.get("type") == "b" for d in devices[1:])  # no block device


def test_root_holds_the_default_capabilities_and_a_user_holds_none() -> None:
    root = runtime_config(spec())["process"]
    assert root["capabilities"]["effective"] == list(DEFAULT_CAPABILITIES)
    assert "CAP_SYS_ADMIN" not in DEFAULT_CAPABILITIES
    assert "CAP_NET_RAW" not in DEFAULT_CAPABILITIES and "CAP_MKNOD" not in DEFAULT_CAPABILITIES
    user = runtime_config(spec(user=Identity(1000, 1000, (50,))))["process"]
    assert user["capabilities"]["effective"] == [] == user["capabilities"]["permitted"]
    assert user["user"] == {"uid": 1000, "gid": 1000, "additionalGids": [50]}
    assert root["noNewPrivileges"] is True and user["noNewPrivileges"] is True


def test_kernel_files_are_masked_or_read_only_and_only_named_host_files_are_bound() -> None:
    config = runtime_config(spec(etc_files=(("/etc/hosts", "/state/m1/hosts"),)))
    assert "/proc/kcore" in config["linux"]["maskedPaths"]
    assert "/proc/sys" in config["linux"]["readonlyPaths"]
    binds = [m for m in config["mounts"] if m["type"] == "bind"]
    assert binds == [{"destination": "/etc/hosts", "type": "bind", "source": "/state/m1/hosts",
                      "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}]
    sysfs = next(m for m in config["mounts"] if m["type"] == "sysfs")
    assert "ro" in sysfs["options"]


def test_the_same_spec_gives_the_same_config() -> None:
    assert runtime_config(spec()) == runtime_config(spec())


def test_users_resolve_as_docker_resolves_them() -> None:
    assert resolve_user("", PASSWD, GROUP).uid == 0
    app = resolve_user("app", PASSWD, GROUP)
    assert (app.uid, app.gid, app.additional_gids, app.home) == (1000, 1000, (33, 50),
                                                                 "/home/app")
    assert resolve_user("app:web", PASSWD, GROUP).gid == 33
    assert resolve_user("1000:0", PASSWD, GROUP).gid == 0
    stranger = resolve_user("4321", PASSWD, GROUP)  # not in passwd: group 0, home /
    assert (stranger.uid, stranger.gid, stranger.home) == (4321, 0, "/")
    assert resolve_user("", "", "").uid == 0  # an image without a passwd file


@pytest.mark.parametrize("user", ["ghost", "app:nogroup", "70000", "1:70000"])
def test_unknown_names_and_ids_outside_the_range_are_refused(user: str) -> None:
    with pytest.raises(BadUser):
        resolve_user(user, PASSWD, GROUP)


def test_argv_follows_docker_with_kubernetes_overrides() -> None:
    image = ImageConfig(entrypoint=["/init"], cmd=["serve", "--fast"])
    assert image.argv_with([], []) == ["/init", "serve", "--fast"]
    assert image.argv_with([], ["debug"]) == ["/init", "debug"]
    assert image.argv_with(["python3"], []) == ["python3"]  # the image's Cmd is dropped
    assert image.argv_with(["python3"], ["app.py"]) == ["python3", "app.py"]
    assert ImageConfig().argv_with([], []) == []


def test_an_image_with_nothing_to_run_is_refused_unless_the_app_says_what() -> None:
    machine = MachineSpec(app="a", image="x")
    with pytest.raises(NothingToRun):
        run_plan("m1", machine, ImageConfig())
    plan = run_plan("m1", MachineSpec(app="a", image="x", cmd=["/bin/app"]), ImageConfig())
    assert plan.argv == ["/bin/app"]


def test_the_port_is_the_apps_else_the_images_one_exposed_port_else_8080() -> None:
    assert default_port(ImageConfig(exposed_ports=["9000/tcp"])) == 9000
    assert default_port(ImageConfig(exposed_ports=["53/udp", "9000/tcp"])) == 9000
    assert default_port(ImageConfig(exposed_ports=["80/tcp", "443/tcp"])) == 8080
    assert default_port(ImageConfig()) == 8080
    plan = run_plan("m1", MachineSpec(app="a", image="x", port=7000),
                    ImageConfig(cmd=["x"], exposed_ports=["9000/tcp"]))
    assert plan.port == 7000 and plan.env["PORT"] == "7000"


def test_environment_is_image_then_app_then_the_platforms() -> None:
    image = ImageConfig(cmd=["x"], env=["PATH=/opt/bin", "MODE=image", "KEEP=1"])
    plan = run_plan("m1", MachineSpec(app="a", image="x", env={"MODE": "app"}), image)
    assert plan.env["PATH"] == "/opt/bin" and plan.env["MODE"] == "app"
    assert plan.env["KEEP"] == "1" and plan.env["THAW_MACHINE_ID"] == "m1"
    assert "PATH" in run_plan("m1", MachineSpec(app="a", image="x"), ImageConfig(cmd=["x"])).env


def test_stop_signal_is_the_apps_else_the_images_else_sigterm() -> None:
    assert stop_signal("", ImageConfig(stop_signal="SIGINT")) == "SIGINT"
    assert stop_signal("SIGQUIT", ImageConfig(stop_signal="SIGINT")) == "SIGQUIT"
    assert stop_signal("", ImageConfig(stop_signal="2")) == "SIGINT"
    assert stop_signal("", ImageConfig(stop_signal="bogus")) == "SIGTERM"
    assert stop_signal("", ImageConfig()) == "SIGTERM"
    assert signal_name("usr1") == "SIGUSR1"


def test_exits_are_told_as_exited_signalled_oom_or_unknown() -> None:
    assert describe_exit(3 << 8, oom=False) == "exited(3)"
    assert describe_exit(signal.SIGKILL, oom=False) == "signalled(SIGKILL)"
    assert describe_exit(signal.SIGKILL, oom=True) == "oom"
    assert describe_exit(None, oom=False) == "exited(?)"
    assert describe_returncode(-signal.SIGTERM) == "signalled(SIGTERM)"
    assert describe_returncode(0) == "exited(0)"
