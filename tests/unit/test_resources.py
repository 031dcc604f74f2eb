"""The memory and disk alarms (brokerd.server.resources) with fake readings."""

from __future__ import annotations

from pathlib import Path

from brokerd.model.broker import Limits
from brokerd.server.resources import ResourceMonitor, cgroup_memory_limit, format_bytes


class Readings:
    def __init__(self) -> None:
        self.memory = 100
        self.disk = 10**12
        self.trims = 0
        self.blocks: list[tuple[str, str | None]] = []
        self.now = 1000.0

    def trim(self) -> None:
        self.trims += 1
        self.memory -= 50  # the allocator gave freed pages back


def monitor(limits: Limits, r: Readings, *, trim: bool = True, share: int = 1) -> ResourceMonitor:
    return ResourceMonitor(
        lambda: limits,
        Path("/data"),
        lambda cause, reason: r.blocks.append((cause, reason)),
        read_memory=lambda: r.memory,
        read_disk_free=lambda path: r.disk,
        total=1000,
        clock=lambda: r.now,
        trim=r.trim if trim else None,
        share=share,
    )


def test_memory_alarm_blocks_and_clears_once_each():
    r, limits = Readings(), Limits()  # watermark 0.4 of 1000 bytes: 400
    m = monitor(limits, r)
    m.check()
    assert r.blocks == [] and m.alarm_list() == []
    r.memory = 500
    m.check_memory()  # over: a trim first (500 -> 450), still over
    assert r.trims == 1
    assert r.blocks == [("memory", "low on memory")]
    assert m.alarm_list() == [
        {
            "kind": "memory",
            "message": "memory alarm: resident memory passed the high watermark of 400 B; "
            "publishers are blocked",
            "since": 1000.0,
        }
    ]
    r.now += 5
    m.check_memory()  # still over: no second block, the alarm keeps its start
    assert r.blocks == [("memory", "low on memory")]
    assert m.alarm_list()[0]["since"] == 1000.0
    r.memory = 399
    m.check_memory()
    assert r.blocks[-1] == ("memory", None)
    assert m.status()["memory"] == {
        "used": 399,
        "limit": 400,
        "total": 1000,
        "watermark": 0.4,
        "share": 1,
        "alarm": False,
    }


def test_trim_can_clear_the_alarm_by_itself():
    r, limits = Readings(), Limits(vm_memory_high_watermark_bytes=420)
    m = monitor(limits, r)
    r.memory = 440  # only freed-but-kept pages above the watermark
    m.check_memory()
    assert r.trims == 1 and r.blocks == [] and m.memory_used == 390


def test_a_reload_moves_the_watermark_at_the_next_check():
    r, limits = Readings(), Limits()
    m = monitor(limits, r)
    r.memory = 350
    m.check_memory()
    assert r.blocks == []
    limits.vm_memory_high_watermark = 0.3
    m.check_memory()
    assert r.blocks == [("memory", "low on memory")]
    assert m.status()["memory"]["limit"] == 300


def test_disk_alarm_below_the_free_limit():
    r, limits = Readings(), Limits(disk_free_limit=5000)
    m = monitor(limits, r)
    r.disk = 4999
    m.check_disk()
    assert r.blocks == [("disk", "low on disk")]
    assert m.status()["disk"] == {"free": 4999, "limit": 5000, "path": "/data", "alarm": True}
    r.disk = 5000
    m.check_disk()
    assert r.blocks[-1] == ("disk", None)


def test_an_unreadable_disk_keeps_the_last_state(caplog):
    r, limits = Readings(), Limits()
    m = monitor(limits, r)

    def fail(path: Path) -> int:
        raise FileNotFoundError(2, "gone")

    m.read_disk_free = fail
    m.check_disk()
    assert r.blocks == [] and m.disk_free is None
    assert "cannot read free disk space" in caplog.text


def test_cgroup_limits_v2_and_v1(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/app.slice/brokerd.service\n")
    v2 = tmp_path / "sys/fs/cgroup/app.slice/brokerd.service"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) is None
    (v2 / "memory.max").write_text("2147483648\n")
    assert cgroup_memory_limit(tmp_path) == 2 * 1024**3
    (tmp_path / "proc/self/cgroup").write_text("4:memory:/docker/abc\n0::/\n")
    v1 = tmp_path / "sys/fs/cgroup/memory/docker/abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory_limit(tmp_path) is None
    (v1 / "memory.limit_in_bytes").write_text("1073741824\n")
    assert cgroup_memory_limit(tmp_path) == 1024**3


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1536, 50_000_000, 3 * 1024**4)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "47.7 MiB",
        "3.0 TiB",
    ]


def test_a_worker_watches_its_share_of_the_hosts_watermark():
    """brokerd --workers 2: each worker blocks at half the host's watermark, so the
    host as a whole stays under it."""
    r, limits = Readings(), Limits()  # the host's watermark: 0.4 of 1000 bytes
    m = monitor(limits, r, trim=False, share=2)
    assert m.memory_limit == 200 and m.status()["memory"]["share"] == 2
    r.memory = 250  # under the host's 400, over this worker's 200
    m.check_memory()
    assert r.blocks == [("memory", "low on memory")]
