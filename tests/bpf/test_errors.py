"""Bad input: no BTF, not root, a missing hook (partial attach, reported), bad parameters."""

from __future__ import annotations

import os

import pytest

from cachepilot.errors import UserError
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf


def test_kernel_without_btf_is_one_clear_error(bpf_env: None) -> None:
    with pytest.raises(UserError, match=r"no BTF .*/nonexistent/vmlinux.*still work"):
        Probe(btf_path="/nonexistent/vmlinux")


def test_not_root_is_one_clear_error(bpf_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match=r"needs root .*still work"):
        Probe()


def test_not_root_through_the_cli(bpf_env: None, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from cachepilot.cli import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["probe", "--dev", "/", "--seconds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err


def test_missing_optional_hook_is_a_reported_partial_attach(bpf_env: None) -> None:
    with Probe(max_files=64, unavailable={"on_ext4_free_blocks", "sys_fsync"}) as p:
        assert p.report.partial
        assert set(p.report.failed) == {"on_ext4_free_blocks", "sys_fsync"}
        assert "on_bio_queue" in p.report.attached
        assert p.report.missing_features() == ["durability calls: fsync", "freed extents (ext4)"]
        summary = p.report.summary()
        assert "NOT attached: on_ext4_free_blocks" in summary and "missing features" in summary


def test_missing_iomap_falls_back_to_syscalls(bpf_env: None) -> None:
    with Probe(max_files=64, unavailable={"on_dio_begin"}) as p:
        assert p.report.dio_hook == "syscalls"
        assert "sys_dio_pread64" in p.report.disabled  # loaded, attached when a stacked volume is watched
        assert not p.report.partial  # the fallback covers it


def test_block_io_uses_the_variant_the_kernel_can_run(bpf_env: None) -> None:
    with Probe(max_files=64) as p:  # this host (6.18) exports bpf_rdonly_cast
        assert "on_bio_queue" in p.report.attached and "on_bio_queue_compat" in p.report.disabled
    with Probe(max_files=64, unavailable={"on_bio_queue"}) as p:  # as on 6.1
        assert "on_bio_queue_compat" in p.report.attached and not p.report.partial
        assert p.report.disabled["on_bio_queue"] == "block I/O uses on_bio_queue_compat: marked unavailable"


def test_missing_required_hook_refuses_to_run(bpf_env: None) -> None:
    with pytest.raises(UserError, match="required hook.*on_bio_queue: marked unavailable; on_bio_queue_compat: mar"):
        Probe(max_files=64, unavailable={"on_bio_queue", "on_bio_queue_compat"})


@pytest.mark.parametrize(
    "kwargs",
    [{"dio_hook": "kprobe"}, {"max_files": 0}, {"ringbuf_bytes": 5000}, {"object_path": "/nonexistent.o"}],
)
def test_bad_parameters(bpf_env: None, kwargs: dict) -> None:
    with pytest.raises(UserError):
        Probe(**kwargs)


def test_a_broken_object_is_one_line_and_libbpf_stays_quiet(
    bpf_env: None, tmp_path, capfd: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "broken.bpf.o"
    bad.write_bytes(b"\x7fELF" + bytes(200))
    with pytest.raises(UserError) as exc:
        Probe(object_path=bad)
    assert "\n" not in str(exc.value) and "broken.bpf.o" in str(exc.value)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_full_watch_table_is_one_error_and_the_watches_stay_consistent(bpf_env: None) -> None:
    from cachepilot.events import kdev

    with Probe(max_files=64) as p:
        p.watch_volume(kdev(250, 0), lower=[kdev(251, i) for i in range(200)])
        with pytest.raises(UserError, match="too many watched devices"):
            p.watch_volume(kdev(250, 1), lower=[kdev(252, i) for i in range(100)])
        assert len(p.volumes) == 201 and kdev(250, 1) not in p.volumes  # what the kernel's table holds
        assert kdev(250, 1) not in p._slots  # noqa: SLF001 - its volume slot is free again
        p.unwatch(kdev(250, 0))
        assert not p.volumes
