"""The dev scripts' port choice: the listeners of one server never share a port
(a second SeaweedFS once died at start with two listeners on one port)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

DEV = Path(__file__).resolve().parents[2] / "dev"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(DEV))
    try:
        loader = importlib.machinery.SourceFileLoader(f"dev_{name}", str(DEV / name))
        spec = importlib.util.spec_from_loader(loader.name, loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(DEV))


def test_free_ports_are_distinct_and_avoid_the_taken_ones() -> None:
    background = load("background.py")
    taken = background.free_ports(20)
    ports = background.free_ports(200, taken=taken)
    assert len(set(ports)) == 200
    assert not set(ports) & set(taken)


def test_seaweedfs_keeps_its_saved_ports_only_when_all_differ_from_each_other_and_s3(
    tmp_path: Path,
) -> None:
    seaweedfs = load("seaweedfs")
    names = [f"{n}{g}" for n in ("master", "volume", "filer") for g in ("", ".grpc")]
    saved = dict(zip(names, seaweedfs.free_ports(7)[:6], strict=True))
    s3 = seaweedfs.free_port(taken=saved.values())
    (tmp_path / "ports.json").write_text(json.dumps(saved))
    assert seaweedfs.server_ports(tmp_path, s3) == saved  # the master's state stays

    for clash in ({**saved, "filer.grpc": saved["volume.grpc"]}, {**saved, "volume": s3}):
        (tmp_path / "ports.json").write_text(json.dumps(clash))
        ports = seaweedfs.server_ports(tmp_path, s3)
        values = [*ports.values(), s3]
        assert sorted(ports) == sorted(names) and len(set(values)) == 7
        assert json.loads((tmp_path / "ports.json").read_text()) == ports
