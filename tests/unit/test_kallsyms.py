"""The probe's kernel-symbol check (probe.checks.has_kernel_symbol) on fixture kallsyms files."""

from __future__ import annotations

from pathlib import Path

from cachepilot.probe.checks import has_kernel_symbol as _has_kernel_symbol


def test_a_symbol_counts_only_with_its_address(tmp_path: Path) -> None:
    """Under the systemd unit (no CAP_SYSLOG) every address reads 0: libbpf resolves the object's weak ksym to 0,
    so the direct-I/O hook keyed on it never matches and the syscall fallback must stay on."""
    seen = tmp_path / "kallsyms"
    seen.write_text("ffffffff81234560 T iomap_dio_bio_end_io\nffffffff81234570 t bio_chain_endio\n")
    hidden = tmp_path / "hidden"
    hidden.write_text("0000000000000000 T iomap_dio_bio_end_io\n0000000000000000 t bio_chain_endio\n")
    assert _has_kernel_symbol("iomap_dio_bio_end_io", str(seen))
    assert not _has_kernel_symbol("iomap_dio_bio_end_io", str(hidden))
    assert not _has_kernel_symbol("dio_bio_end_io", str(seen))  # a whole name, not a suffix
    assert not _has_kernel_symbol("iomap_dio_bio_end_io", str(tmp_path / "missing"))
