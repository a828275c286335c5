"""Source archives that images are built from, pinned like the data sets.

Each source is a GitHub repository at a fixed commit.  Its archive is either
fetched from ``https://github.com/<owner>/<repo>/archive/<commit>.tar.gz`` into
the user cache, or taken from a local mirror (``--sources DIR`` or
``DLBENCH_SOURCES_DIR``) laid out as ``DIR/<group>/<repo>-<commit>.tar.gz``.

A mirror's archives were made with ``git archive`` and their bytes differ from
GitHub's downloads of the same commit, so what is verified is the *tree*: the
SHA-256 over the sorted member paths (below the top folder ``<repo>-<commit>/``,
which both name alike), their types, their exec bits and the file contents.
Where a mirror keeps only part of a repository (``paths``), the checksum covers
those folders only, and only those are used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .. import cache, catalog
from ..errors import DlbenchError, reason

MIRROR_VARIABLE = "DLBENCH_SOURCES_DIR"
GITHUB = "https://github.com"
FETCH_TIMEOUT_S = 60


class SourceError(DlbenchError):
    pass


@dataclass(frozen=True)
class Source:
    group: str          # the mirror's folder
    repo: str           # owner/name on GitHub
    commit: str
    tree_sha256: str
    paths: tuple[str, ...] = ()   # only these folders are checked and used; () = all

    @property
    def name(self) -> str:
        return self.repo.split("/")[1]

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.commit}.tar.gz"

    @property
    def top(self) -> str:
        return f"{self.name}-{self.commit}/"

    @property
    def url(self) -> str:
        return f"{GITHUB}/{self.repo}/archive/{self.commit}.tar.gz"


def _s(group, repo, commit, tree, paths=()):
    return Source(group, repo, commit, tree, tuple(paths))


# Lua Torch7 and its packages at torch/distro's submodule pins (its last commit,
# 2018-01-22; cutorch and cunn are its CUDA packages), torch/demos (only the two
# demos), GTDLBench's own Torch scripts and the Theano tutorial it names.
# Tree checksums computed from the mirror's archives (commit dates as comments).
REGISTRY: tuple[Source, ...] = (
    _s("torch7", "Yonaba/Moses", "ded0a9b773bb78ded2c1dd5da721bbee4a3e32c6",  # 2017-04-29
       "45513b9754ba1f3468b7aea42bdf1ab605d1c426446546d9e5e2362c52471ce7"),
    _s("torch7", "clementfarabet/lua---nnx", "1c28e231f885899a4ed68266e788306cab2ac07a",  # 2017-05-30
       "184466bf91d7207940e7f9ce0a28088e3215f185462e76d057fb312f7c9a8aeb"),
    _s("torch7", "facebook/luaffifb", "610ce4dc6de318c8f0eb027f052be081349097be",  # 2016-10-27
       "33025745d1d0717c66db76738120e148395f0e3b59bd03d7f6bbfecec59fcb45"),
    _s("torch7", "keplerproject/luafilesystem", "3c4e563d9c140319e28c419f2710b51a2f6d6d24",  # 2016-10-14
       "60684d5afefc8212addcd31e8af4b2d0bbbc2e2ae1751ea6f730e778dd517fa8"),
    _s("torch7", "lunarmodules/Penlight", "6d108e6a699fbafd5dace1019d03f4b4b18231fa",  # 2017-07-17
       "62e74a3c8c5b5510cd177e73bc4135b090355e58ea95254d64c29856576cd4cc"),
    _s("torch7", "mpx/lua-cjson", "e8972ac754788d3ef10a57a36016d6c3e85ba20d",  # 2016-08-25
       "330f1162f21bd7cc2b117d9be39e336a888b656aca16b15a15818c8072c2eae6"),
    _s("torch7", "torch/cunn", "27d79db5ac8f9fa3995ac43f876e4eb146d99913",  # 2017-07-13
       "9a639d364604ba2296851973766824d733be539bc9c023c6008eb016449203f3"),
    _s("torch7", "torch/cutorch", "caf84f3af0b1e9f6bd5c4129c01345f7bd72e431",  # 2017-07-17
       "2ce127118aba4cea3f97e929e1f07be47ad8076b283ed31362f69891b5937ad4"),
    _s("torch7", "torch/cwrap", "dbd0a623dc4dfb4b8169d5aecc6dd9aec2f22792",  # 2016-02-22
       "e6c16482b9d85277c0d2e439c20c2b6616b7881a03c52bbd176cf2f5af5ed1a9"),
    _s("torch7", "torch/demos", "ef43a1c8d04dc3d11794d9c2c9f3a050d5e1e4bd",  # 2016-09-21
       "b5e0e9bde9f2c98551d835db030083c7b3bb8af2998474f23c7e24042bd6b548",
       ('train-a-digit-classifier/', 'train-on-cifar/')),
    _s("torch7", "torch/dok", "1b36900e1bfa6ee7f48db52c577bdeb7d9e85909",  # 2016-01-31
       "68a2967d386d71e5e55c13ad7e5093fb1cebf13a2bbbea1295b77a011b9859a1"),
    _s("torch7", "torch/image", "5aa18819b6a7b44751f8a858bd232d1c07b67985",  # 2017-04-20
       "f4536129c80ca3db3e1259bea9098f6b270a4247215187506ea3456076229477"),
    _s("torch7", "torch/luajit-rocks", "411f4b9d9c4be176d4aab965ebfce50911583e14",  # 2016-08-10
       "5b90e96e301f341af470ea9b499c176383e04ff3c39d402af4d5a2384ebb2f97"),
    _s("torch7", "torch/nn", "200ae7d55a3381a232256223c0694498f8f51df0",  # 2017-07-12
       "95a16b36ec677790c0b3c82be8f0c446e051c097e9522786e79f7c3726203ba4"),
    _s("torch7", "torch/optim", "656c42af1f996e4a5d6aae3b9aeac831ca162241",  # 2017-02-08
       "16eec12a7fa3fda66f4385e5eede61f26205c35e1223ed8a14037684c6104f87"),
    _s("torch7", "torch/paths", "4ebe222ba12589fb9d86c1d3895d7f509df77b6a",  # 2017-02-26
       "51e8fbf4d4877e084b9a09d5ced28988fdff80ac537321a574b65c371132d63f"),
    _s("torch7", "torch/sundown-ffi", "4324669b1adbde92cef2dbf4550428a13a03ca6f",  # 2016-10-27
       "ea05261c0ce7effff6c194382bf56dd712feffe83ff08ae1c585a9a834a55e72"),
    _s("torch7", "torch/sys", "f073f057d3fd2148866eaa0444a62ababfdf935e",  # 2016-10-27
       "933b0060c48f966ddc52656c48768fd8f3092ed54a486fee6a4f5a8e841b5463"),
    _s("torch7", "torch/torch7", "3e9e141ced1afd0cad451e69f90e6e53503647ca",  # 2017-07-14
       "235ab3106de54c4734adb8941edd86c31c0ac345ae13c92b8efe0c647cd5e489"),
    _s("torch7", "torch/trepl", "e5e17e3a56997123bd6c66cb8575175d3a6945bb",  # 2017-06-19
       "7fb42500bfbb44a6a1b3547e56e9094b6613599b4264f0f0512d7171738dd2ba"),
    _s("torch7", "torch/xlua", "41308fe696bf8b0892f4ad4f9857d12a87a3f75e",  # 2016-07-19
       "b9088de1e2de9c14c8274803b12f7eb89d79292c41aeda201c2e5d0e498172b2"),
    _s("gtdlbench", "git-disl/GTDLBench", "f1c5c4d3690013d2c653cdb0ef308e390850d562",  # 2024-06-22
       "f3f798de44893134be58ea4e5786c655463d31bb645a3f228e899204f52102aa",
       ('models/mnist/torch/', 'models/cifar10/torch/')),
    _s("gtdlbench", "benanne/theano-tutorial", "b6c4b1e443734a19eb734c314ca113be5da72f2b",  # 2015-02-12
       "1599f06001fc90a25aeda80db92486996f8ff4e042868b0502b913cc715000ba"),
)

_ARCHIVE_NAME = re.compile(r"^(?P<name>.+)-(?P<commit>[0-9a-f]{40})\.tar\.gz$")


def lookup(repo: str) -> Source:
    for source in REGISTRY:
        if source.repo == repo:
            return source
    raise SourceError(f"unknown source {repo!r} (the registry has: "
                      f"{', '.join(s.repo for s in REGISTRY)})")


def tree_sha256(archive: Path, top: str, paths: tuple[str, ...] = ()) -> str:
    """The tree checksum of a .tar.gz whose members all lie under ``top``."""
    entries = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = member.name
                if member.isdir():
                    continue            # git has no empty folders: files imply them
                if not name.startswith(top):
                    raise SourceError(f"{archive}: member {name!r} lies outside {top}")
                rel = name[len(top):]
                if paths and not any(rel.startswith(p) for p in paths):
                    continue
                if member.issym():
                    entries.append((rel, "l", "", hashlib.sha256(member.linkname.encode()).hexdigest()))
                elif member.isfile():
                    content = tar.extractfile(member).read()
                    entries.append((rel, "f", "x" if member.mode & 0o111 else "-",
                                    hashlib.sha256(content).hexdigest()))
                else:
                    raise SourceError(f"{archive}: member {name!r} is neither a file nor a link")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise SourceError(f"{archive}: damaged archive ({exc})") from None
    if not entries:
        raise SourceError(f"{archive}: no files under {top}{'|'.join(paths)}")
    digest = hashlib.sha256()
    for rel, kind, mode, content in sorted(entries):
        digest.update(f"{rel}\0{kind}\0{mode}\0{content}\n".encode())
    return digest.hexdigest()


def verify(source: Source, archive: Path) -> Path:
    """The archive if its tree is the registry's; else a SourceError naming the file."""
    found = tree_sha256(archive, source.top, source.paths)
    if found != source.tree_sha256:
        raise SourceError(f"{archive}: tree checksum {found[:16]}… is not {source.repo}@"
                          f"{source.commit[:12]}'s ({source.tree_sha256[:16]}…): damaged or altered")
    return archive


def mirror_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local mirror chosen (--sources, then DLBENCH_SOURCES_DIR), or None (GitHub)."""
    chosen = explicit or os.environ.get(MIRROR_VARIABLE)
    if not chosen:
        return None
    path = Path(chosen).expanduser()
    if not path.is_dir():
        what = "--sources" if explicit else MIRROR_VARIABLE
        raise SourceError(f"{what} {chosen}: no such directory (expected a sources mirror: "
                          f"<group>/<repo>-<commit>.tar.gz)")
    return path


def cache_dir() -> Path:
    return cache.folder("sources")


def _other_commits(folder: Path, source: Source) -> list[str]:
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        match = _ARCHIVE_NAME.match(path.name)
        if match and match["name"] == source.name and match["commit"] != source.commit:
            found.append(path.name)
    return found


def locate(source: Source, mirror: Path | None) -> Path:
    """Where the source's archive is (mirror or user cache), fetched if need be; unverified."""
    if mirror is not None:
        path = mirror / source.group / source.filename
        if path.is_file():
            return path
        others = _other_commits(path.parent, source)
        if others:
            raise SourceError(f"{path}: missing; {path.parent / others[0]} is an unknown commit of "
                              f"{source.repo} (dlbench builds {source.commit})")
        raise SourceError(f"{path}: missing from the sources mirror ({source.repo}@{source.commit[:12]})")
    path = cache_dir() / source.group / source.filename
    if not path.is_file():
        _fetch(source, path)
    return path


def _fetch(source: Source, target: Path) -> None:
    """The source's archive from GitHub into ``target``, verified; else one line saying
    which archive, why, and that a local mirror does without GitHub (the URL and the
    library's exception are the error's detail)."""
    import requests

    partial = target.with_name(target.name + ".part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with requests.get(source.url, stream=True, timeout=FETCH_TIMEOUT_S) as response:
            response.raise_for_status()
            with open(partial, "wb") as f:
                for chunk in response.iter_content(1 << 20):
                    f.write(chunk)
        verify(source, partial)
        partial.replace(target)
        return
    except requests.HTTPError as exc:
        why, failure = f"GitHub answered HTTP {exc.response.status_code} {exc.response.reason}", exc
    except requests.Timeout as exc:
        why, failure = f"no network (no answer in {FETCH_TIMEOUT_S} s)", exc
    except requests.exceptions.ProxyError as exc:
        why, failure = f"no network (the proxy: {reason(exc)})", exc
    except requests.ConnectionError as exc:
        why, failure = f"no network ({urlsplit(source.url).netloc}: {reason(exc)})", exc
    except requests.RequestException as exc:
        why, failure = f"the download broke off ({reason(exc)})", exc
    except SourceError as exc:
        why, failure = "the download fails its tree checksum (damaged or altered)", exc
    except OSError as exc:
        raise SourceError(f"{target.parent}: cannot write the source cache ({exc.strerror}); give "
                          f"a local mirror with --sources DIR or {MIRROR_VARIABLE}",
                          detail=f"{type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)     # gone already once the download is in place
    raise SourceError(
        f"cannot fetch the source archive {source.group}/{source.filename} ({source.repo}@"
        f"{source.commit[:12]}): {why}; give a local mirror of the pinned archives with "
        f"--sources DIR or {MIRROR_VARIABLE}",
        detail=f"GET {source.url}: {type(failure).__name__}: {failure}") from None


def prepare(repos: list[str], mirror: Path | None) -> dict[Source, Path]:
    """Every named source's archive, located and verified."""
    return {source: verify(source, locate(source, mirror)) for source in map(lookup, repos)}


def prepare_for(images, sources_dir: str | os.PathLike | None) -> None:
    """The pinned source archives of the images to build, (framework, variant) pairs,
    verified (fetched if need be) before any build; a mirror named is checked even
    when none of them has sources."""
    mirror = mirror_dir(sources_dir)
    pinned = sorted({repo for fw, variant in images for repo in catalog.sources(fw, variant)})
    if pinned:
        prepare(pinned, mirror)


def status(mirror: Path | None):
    """Yield (source, ok, detail) for every registered source, fetching nothing."""
    for source in REGISTRY:
        path = (mirror if mirror is not None else cache_dir()) / source.group / source.filename
        if not path.is_file():
            yield source, None, f"not in {path.parent}" + ("" if mirror else "; fetched from GitHub when a build needs it")
            continue
        try:
            verify(source, path)
            yield source, True, str(path)
        except SourceError as exc:
            yield source, False, str(exc)
