"""The ABI reading against real shared objects: built here with g++ from two tiny C++ files (a "torch"
library that defines c10:: / at:: symbols, an "extension" that needs them), packed into zip wheels and
served on 127.0.0.1 by a server that honours Range and by one that ignores it.

Compiles, so it is out of the fast loop (``HEAVY_MODULES`` in tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import http.server
import random
import shutil
import socket
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from stackforge.core.model import Flavour, Stack
from stackforge.core.wheel_readings import ReleaseFile
from stackforge.edges.index import IndexConfig
from stackforge.edges.ranges import MemberBytes, ZipMember
from stackforge.plan.derive import Derived
from stackforge.plan.preflight import Availability, PackageCheck, PreflightReport
from stackforge.wheels import abi
from stackforge.wheels.abi import AbiStatus, check_stacks, compare, demangle, is_torch_symbol, read_wheel_abi
from stackforge.wheels.elf import _PHDR, ElfError, _by_dynamic, dynamic_symbols

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the test objects")

TORCH_CPP = """
namespace c10 {
int kept(int x) { return x + 1; }
#ifndef NEW_TORCH
int dropped(int x) { return x + 2; }
#endif
}
namespace at { struct Tensor { int size() const; }; int Tensor::size() const { return 3; } }
extern "C" int plain_c_function(void) { return 4; }
"""
EXTENSION_CPP = """
namespace c10 { int kept(int); int dropped(int); }
namespace at { struct Tensor { int size() const; }; }
int use(const at::Tensor& t, int x) { return c10::kept(x) + c10::dropped(x) + t.size(); }
extern "C" int plain_c_function(void);
int more(void) { return plain_c_function(); }
"""
EMPTY_CPP = "int nothing_here() { return 0; }\n"
#: An incompressible member that makes each wheel megabytes long: a reading fetches far less.
BLOB = 6 << 20
KEPT, DROPPED = "_ZN3c104keptEi", "_ZN3c107droppedEi"


def _build(folder: Path, name: str, source: str, *defines: str) -> Path:
    cpp = folder / f"{name}.cpp"
    cpp.write_text(source)
    out = folder / f"{name}.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", *defines, str(cpp), "-o", str(out)], check=True)
    return out


def _wheel(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("objects")
    return {"old": _build(folder, "torch_old", TORCH_CPP).read_bytes(),
            "new": _build(folder, "torch_new", TORCH_CPP, "-DNEW_TORCH").read_bytes(),
            "ext": _build(folder, "ext", EXTENSION_CPP).read_bytes(),
            "empty": _build(folder, "empty", EMPTY_CPP).read_bytes()}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory, objects) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("wheels")
    blob = random.Random(7).randbytes(BLOB)
    libs = [("torch/lib/libc10.so", objects["new"])] + [(name, objects["empty"]) for name in abi.TORCH_LIBRARIES[1:]]
    torch = _wheel(folder / "torch-2.99.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                   [("torch/__init__.py", b"# torch\n"), *libs, ("torch/lib/blob.bin", blob),
                    ("torch-2.99.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: torch\nVersion: 2.99.0\n")])
    extension = _wheel(folder / "sgl_kernel-9.9.9-cp310-abi3-manylinux2014_x86_64.whl",
                       [("sgl_kernel/__init__.py", b""), ("sgl_kernel/blob.bin", blob),
                        ("sgl_kernel/common_ops.abi3.so", objects["ext"]),
                        ("sgl_kernel-9.9.9.dist-info/METADATA",
                         (b"Metadata-Version: 2.1\nName: sgl-kernel\nVersion: 9.9.9\nRequires-Dist: torch==2.98.0\n"
                          b"Requires-Dist: torchvision\n"))])
    return {"torch": torch, "extension": extension}


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[str, Path], *, ranges: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files, self.ranges, self.sent, self.requests = files, ranges, 0, 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.requests += 1
        if self.path.startswith("/simple/"):
            return self._page(self.path.strip("/").split("/")[1])
        path = self.server.files.get(self.path.rsplit("/", 1)[1])
        if path is None:
            self.send_error(404)
            return
        data = path.read_bytes()
        wanted = self.headers.get("Range", "")
        if wanted.startswith("bytes=") and self.server.ranges:
            first, _, last = wanted[6:].partition("-")
            start, end = (len(data) - int(last), len(data) - 1) if not first else \
                (int(first), min(len(data) - 1, int(last) if last else len(data) - 1))
            start = max(0, start)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            body = data[start:end + 1]
        else:
            self.send_response(200)
            body = data
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for at in range(0, len(body), 65536):
                self.wfile.write(body[at:at + 65536])
                self.server.sent += len(body[at:at + 65536])
        except (BrokenPipeError, ConnectionResetError):
            pass   # the reader had what it needed and closed

    def _page(self, project: str) -> None:
        links = "".join(f'<a href="/files/{name}#sha256={hashlib.sha256(path.read_bytes()).hexdigest()}">{name}</a>'
                        for name, path in self.server.files.items()
                        if name.split("-")[0].replace("_", "-") == project)
        body = f"<html><body>{links}</body></html>".encode()
        self.send_response(200 if links else 404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _serve(wheels: dict[str, Path], *, ranges: bool):
    server = _Server({path.name: path for path in wheels.values()}, ranges=ranges)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def ranged(wheels):
    server = _serve(wheels, ranges=True)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def unranged(wheels):
    server = _serve(wheels, ranges=False)
    yield server
    server.shutdown()
    server.server_close()


def _file(server: _Server, path: Path, dist: str, version: str) -> ReleaseFile:
    return ReleaseFile(dist=dist, version=version, filename=path.name, url=f"{server.url}/files/{path.name}",
                       sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def _at(data: bytes):
    def read_at(offset: int, length: int) -> bytes:
        if offset + length > len(data):
            raise EOFError(offset + length)
        return data[offset:offset + length]
    return read_at


# --- the ELF reading -------------------------------------------------------------------------------------

def test_the_dynamic_symbols_are_those_nm_lists(objects, tmp_path):
    torch = dynamic_symbols(_at(objects["old"]), limit=len(objects["old"]))
    ext = dynamic_symbols(_at(objects["ext"]), limit=len(objects["ext"]))
    assert {KEPT, DROPPED, "_ZNK2at6Tensor4sizeEv", "plain_c_function"} <= torch.defined
    assert {KEPT, DROPPED, "_ZNK2at6Tensor4sizeEv", "plain_c_function"} <= ext.undefined
    assert not ext.undefined & ext.defined
    if shutil.which("nm"):
        (tmp_path / "ext.so").write_bytes(objects["ext"])
        listed = subprocess.run(["nm", "-D", "--undefined-only", str(tmp_path / "ext.so")], capture_output=True,
                                text=True, check=True).stdout
        assert {line.split()[-1].split("@")[0] for line in listed.splitlines() if " U " in line} == ext.undefined


def test_the_layout_reading_agrees_with_the_dynamic_section(objects):
    data = objects["new"]
    by_layout = dynamic_symbols(_at(data), limit=len(data))
    assert by_layout.located.startswith("layout")
    programs = [_PHDR.unpack(data[64 + i * 56:64 + (i + 1) * 56]) for i in range(int.from_bytes(data[56:58], "little"))]
    exact = _by_dynamic(_at(data), programs, next(p for p in programs if p[0] == 2))
    assert (exact.defined, exact.undefined, exact.count) == (by_layout.defined, by_layout.undefined, by_layout.count)
    assert DROPPED not in by_layout.defined and KEPT in by_layout.defined


def test_not_an_elf_object_and_a_table_past_the_limit_are_errors(objects):
    with pytest.raises(ElfError, match="not an ELF"):
        dynamic_symbols(_at(b"PK\x03\x04" + bytes(100)), limit=1 << 20)
    with pytest.raises(ElfError, match="read limit"):
        dynamic_symbols(_at(objects["new"]), limit=256)


def test_torch_symbols_are_told_by_their_mangled_namespace():
    assert all(map(is_torch_symbol, [KEPT, "_ZNK3c106Device3strEv", "_ZN2at4_ops3add4callEv",
                                     "_ZN5torch7Library4_defEv", "_ZTVN3c1011StorageImplE", "_ZTIN2at6TensorE"]))
    assert not any(map(is_torch_symbol, ["plain_c_function", "_ZNSt6vectorIiSaIiEE", "_ZN4cute3fooEv",
                                         "_ZN3c1x3barEv"]))


# --- a zip member by ranges ------------------------------------------------------------------------------

def test_a_member_is_decompressed_only_as_far_as_asked_and_memory_stays_bounded():
    data = random.Random(3).randbytes(3000)
    member = ZipMember("x", 0, len(data), len(data), 0)
    chunks = iter([data[i:i + 100] for i in range(0, len(data), 100)])
    lazy = MemberBytes(member, chunks, keep=500, window=200)
    assert lazy.at(10, 20) == data[10:30] and lazy.decompressed == 100
    assert lazy.at(2000, 50) == data[2000:2050]
    assert lazy.at(100, 10) == data[100:110]            # kept: inside the first 500 bytes
    assert lazy.at(1900, 30) == data[1900:1930]         # inside the window behind 2000
    with pytest.raises(ValueError, match="dropped"):
        lazy.at(1000, 10)
    with pytest.raises(EOFError):
        lazy.at(2990, 20)


def test_torch_side_reads_the_libraries_by_ranges_fetching_far_less_than_the_wheel(ranged, wheels, tmp_path):
    file = _file(ranged, wheels["torch"], "torch", "2.99.0")
    reading = read_wheel_abi(file, side="torch", session=requests.Session(), cache_root=tmp_path)
    size = wheels["torch"].stat().st_size
    assert reading.wheel_size == size and size > BLOB
    assert reading.fetched < size / 20 and ranged.sent == reading.fetched, (reading.fetched, size)
    libc10 = next(lib for lib in reading.libraries if lib.member == "torch/lib/libc10.so")
    assert KEPT in libc10.symbols and DROPPED not in libc10.symbols and "plain_c_function" not in libc10.symbols
    assert {lib.member for lib in reading.libraries} == set(abi.TORCH_LIBRARIES)


def test_extension_against_torch_names_the_missing_symbol_demangled(ranged, wheels, tmp_path):
    session = requests.Session()
    ext = read_wheel_abi(_file(ranged, wheels["extension"], "sgl-kernel", "9.9.9"), side="extension",
                         session=session, cache_root=tmp_path)
    torch = read_wheel_abi(_file(ranged, wheels["torch"], "torch", "2.99.0"), side="torch", session=session,
                           cache_root=tmp_path)
    assert ext.requires_torch == ("torch==2.98.0",)
    assert ext.fetched < wheels["extension"].stat().st_size / 20
    (finding,) = compare(ext, torch, torch="2.99.0+cu130", stacks=["s1"], demangle=demangle)
    assert finding.status is AbiStatus.MISSING and finding.missing == (DROPPED,)
    assert finding.needed == 3   # c10::kept, c10::dropped, at::Tensor::size: not plain_c_function
    expected = "c10::dropped(int)" if shutil.which("c++filt") else DROPPED
    assert finding.line() == (f"abi: sgl_kernel/common_ops.abi3.so (sgl-kernel 9.9.9) needs 1 symbol(s) torch "
                              f"2.99.0+cu130 does not export: {expected}")
    assert any(line.startswith("  wheel: http://127.0.0.1") and file_sha in line
               for line in finding.evidence() for file_sha in [ext.file.sha256])


def test_an_unread_torch_library_leaves_a_missing_symbol_undecided(ranged, wheels, tmp_path):
    session = requests.Session()
    ext = read_wheel_abi(_file(ranged, wheels["extension"], "sgl-kernel", "9.9.9"), side="extension",
                         session=session, cache_root=None)
    torch = read_wheel_abi(_file(ranged, wheels["torch"], "torch", "2.99.0"), side="torch", session=session,
                           cache_root=None)
    unread = abi.LibraryReading("torch/lib/libtorch_cuda.so", error="past the 160 MiB read limit")
    torch = abi.WheelAbi(torch.file, tuple(lib for lib in torch.libraries if "cuda" not in lib.member) + (unread,))
    (finding,) = compare(ext, torch, torch="2.99.0+cu130")
    assert finding.status is AbiStatus.UNDECIDED and "libtorch_cuda.so was not read" in finding.why
    report = abi.AbiReport((finding,))
    (line,) = report.warnings()
    assert "undecided" in line and "libtorch_cuda.so not read: past the 160 MiB read limit" in line


def test_a_second_reading_comes_from_the_cache_without_the_network(ranged, wheels, tmp_path):
    file = _file(ranged, wheels["torch"], "torch", "2.99.0")
    first = read_wheel_abi(file, side="torch", session=requests.Session(), cache_root=tmp_path)
    assert (tmp_path / "abi" / f"{file.sha256}.json").is_file()
    ranged.shutdown()
    second = read_wheel_abi(file, side="torch", session=requests.Session(), cache_root=tmp_path)
    assert second.cached and second.fetched == 0 and second.libraries == first.libraries


def test_a_server_that_ignores_range_is_read_as_one_stream_closed_once_all_is_read(unranged, wheels, tmp_path):
    file = _file(unranged, wheels["torch"], "torch", "2.99.0")
    reading = read_wheel_abi(file, side="torch", session=requests.Session(), cache_root=None)
    size = wheels["torch"].stat().st_size
    libc10 = next(lib for lib in reading.libraries if lib.member == "torch/lib/libc10.so")
    assert KEPT in libc10.symbols and DROPPED not in libc10.symbols
    # the six libraries come before the 6 MiB blob: the stream is closed before it
    assert reading.fetched < size / 4, (reading.fetched, size)
    ext = read_wheel_abi(_file(unranged, wheels["extension"], "sgl-kernel", "9.9.9"), side="extension",
                         session=requests.Session(), cache_root=None)
    assert ext.requires_torch == ("torch==2.98.0",)   # read to the end: its METADATA is last
    (finding,) = compare(ext, reading, torch="2.99.0")
    assert finding.missing == (DROPPED,)


def test_a_file_that_is_no_zip_is_a_wheel_file_error(ranged, wheels, tmp_path):
    bogus = tmp_path / "torch-2.99.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    bogus.write_bytes(b"not a zip" * 1000)
    ranged.files[bogus.name] = bogus
    from stackforge.wheels.cache import WheelFileError
    with pytest.raises(WheelFileError, match="End of Central Directory"):
        read_wheel_abi(_file(ranged, bogus, "torch", "2.99.0"), side="torch", session=requests.Session(),
                       cache_root=None)


# --- the stacks ------------------------------------------------------------------------------------------

def _cell(kernel: str = "9.9.9") -> tuple[Stack, Derived]:
    stack = Stack(cuda="13.1", torch="2.99.0", flashinfer="0.7.2", sglang="0.5.23", python="3.11",
                  flavour=Flavour.WHEELS, os="debian12", kernel=kernel)
    derived = Derived(torch_variant="cu130", torch_cuda="13.0", torch_index_url=None, torch_requirement="torch==2.99.0",
                      kernel_package="sgl-kernel", kernel_version=kernel, flashinfer_extra=None,
                      cuda_image_version="13.1.0", base_image="python:3.11-slim-bookworm", base_python="3.11")
    return stack, derived


def test_check_stacks_finds_the_wheels_on_the_index_and_warns_once_per_mismatch(ranged, tmp_path):
    indexes = IndexConfig(index_url=f"{ranged.url}/simple")
    report = check_stacks([_cell(), _cell()], indexes=indexes, cache_root=tmp_path)
    expected = "c10::dropped(int)" if shutil.which("c++filt") else DROPPED
    assert report.warnings() == ((f"abi: sgl_kernel/common_ops.abi3.so (sgl-kernel 9.9.9) needs 1 symbol(s) torch "
                                  f"2.99.0+cu130 does not export: {expected}"),)
    assert report.skipped == ()


def test_check_stacks_says_nothing_when_all_match(ranged, wheels, objects, tmp_path):
    matching = tmp_path / "sgl_kernel-9.9.8-cp310-abi3-manylinux2014_x86_64.whl"
    old_ext = _build(tmp_path, "ext_ok", EXTENSION_CPP.replace("+ c10::dropped(x)", ""))
    _wheel(matching, [("sgl_kernel/common_ops.abi3.so", old_ext.read_bytes())])
    ranged.files[matching.name] = matching
    report = check_stacks([_cell("9.9.8")], indexes=IndexConfig(index_url=f"{ranged.url}/simple"), cache_root=tmp_path)
    assert report.warnings() == () and [f.status for f in report.findings] == [AbiStatus.MATCH]


def test_an_unreachable_index_is_one_warning_line_never_a_failure(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    report = check_stacks([_cell()], indexes=IndexConfig(index_url=f"http://127.0.0.1:{port}/simple"),
                          cache_root=tmp_path)
    assert report.findings == ()
    lines = report.warnings()
    assert [line.split(":")[1:3] for line in lines] == [[" reading skipped", " sgl-kernel 9.9.9"],
                                                        [" reading skipped", " torch 2.99.0"]]
    assert all("package index http://127.0.0.1:" in line and "refused" in line and "\n" not in line for line in lines)


# --- the hooks -------------------------------------------------------------------------------------------

def test_preflight_prints_the_abi_warnings_and_they_do_not_fail_it():
    check = PackageCheck("s1", "torch", "2.99.0", "pypi", Availability.AVAILABLE, "torch-2.99.0.whl")
    report = PreflightReport((check,), abi_warnings=("abi: x.so (k 1) needs 1 symbol(s) torch 2 does not export: f",))
    assert report.ok and "  warning: abi: x.so (k 1) needs 1 symbol(s)" in report.render()
    assert report.to_json()["abi_warnings"] == ["abi: x.so (k 1) needs 1 symbol(s) torch 2 does not export: f"]
    assert "abi" not in PreflightReport((check,)).render()


def test_plan_preflight_and_upgrade_read_wheels_print_the_abi_warnings(monkeypatch, tmp_path, ranged):
    """Both commands through the CLI, on the local index: the shipped matrix's stacks are not on it, so
    the line printed is the reading skipped (the mismatch line is checked above)."""
    from stackforge.cli import cli
    seen: list[list[str]] = []

    def fake(cells, **_):
        seen.append([stack.id for stack, _ in cells])
        return abi.AbiReport(skipped=("sgl-kernel 0.3.21: package index http://x could not be read: refused",))
    monkeypatch.setattr(abi, "check_stacks", fake)
    result = CliRunner().invoke(cli, ["plan", "--preflight", "--no-resolve", "--cuda", "13.1",
                                      "--index-url", f"{ranged.url}/simple"])
    assert "  warning: abi: reading skipped: sgl-kernel 0.3.21" in result.output
    assert seen and all(ids for ids in seen)
    monkeypatch.setattr("stackforge.report.evidence._read_wheels", lambda request, tell: None)
    result = CliRunner().invoke(cli, ["upgrade", "--from-cuda", "12.8", "--to-cuda", "13.1", "--read-wheels",
                                      "--results", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    assert "stackforge: warning: abi: reading skipped: sgl-kernel 0.3.21" in result.stderr
