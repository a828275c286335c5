"""The BLAS libraries an image holds side by side, and which one a job runs on.

Debian installs each BLAS implementation in a folder of its own under the multiarch
library folder, every one with a ``libblas.so.3`` (and some with a ``liblapack.so.3``),
and points the system's ``libblas.so.3`` at one of them (update-alternatives).  A
program linked against ``libblas.so.3`` (Caffe, Theano's compiled ops, Lua Torch7,
Debian's PyTorch and numpy) runs on whichever the dynamic loader finds first, so an
image that installs several can switch per job: ``install`` (run while the image is
built) makes ``/opt/dlbench/blas/<name>/`` for each, holding links to that
implementation's ``libblas.so.3`` and a ``liblapack.so.3`` (its own, or Debian's
reference LAPACK on top of it where it has none), and keeps the first name the
system's default; a job that asks for another starts with that folder first on
``LD_LIBRARY_PATH`` (``environment``).  ``loaded`` names the implementations a process
has mapped, so that a silent fallback shows.  ``mapped`` is the one reading of the
process's memory map: the runner's list of BLAS files and the adapters' OpenBLAS (its
thread count), OpenMP and CUDA run-time libraries are found through it.

Standard library only and Python 3.9, like the rest of the runner; run as a script
(``python3 blas.py install NAME...``) while an image is built, before the runner is
there.
"""

import os
import shutil
import subprocess
import sys
import sysconfig

ROOT = "/opt/dlbench/blas"

# name: (Debian package, its folder under the multiarch library folder, the folder of
# the LAPACK used with it).  "reference" is Netlib's BLAS, Debian's libblas3.  Intel's MKL
# (non-free's libmkl-rt, x86-64 only) is one library, libmkl_rt.so, in the folder itself:
# an image that enables non-free may hold it; dlbench's own do not (it is about 1 GB).
LIBRARIES = {
    "openblas-pthread": ("libopenblas0-pthread", "openblas-pthread", "openblas-pthread"),
    "openblas-openmp": ("libopenblas0-openmp", "openblas-openmp", "openblas-openmp"),
    "blis-pthread": ("libblis3-pthread", "blis-pthread", "lapack"),
    "blis-openmp": ("libblis3-openmp", "blis-openmp", "lapack"),
    "atlas": ("libatlas3-base", "atlas", "atlas"),
    "reference": ("libblas3", "blas", "lapack"),
    "mkl": ("libmkl-rt", "", ""),
}
MKL_FILE = "libmkl_rt.so"
# Short names: OpenBLAS's the images' default flavour; BLIS's the OpenMP one, because its
# pthreads build starts threads for every call and, called from inside an OpenMP loop
# (Theano's convolution over a batch), ran Theano's quick LeNet more than 25 times slower
# (docs/configuration.md).
ALIASES = {"openblas": "openblas-pthread", "blis": "blis-openmp", "netlib": "reference"}
REFERENCE_LAPACK = "liblapack3"
LIBRARY_MARKERS = ("blas", "blis", "mkl", "atlas")


class BlasError(Exception):
    pass


def canonical(name):
    """The library's full name (``openblas`` -> ``openblas-pthread``); BlasError if unknown."""
    name = ALIASES.get(name, name)
    if name not in LIBRARIES:
        raise BlasError("unknown BLAS %r (choose from %s)"
                        % (name, ", ".join(sorted(set(LIBRARIES) | set(ALIASES)))))
    return name


def folder(name):
    return os.path.join(ROOT, canonical(name))


def environment(name, environ=os.environ):
    """The variables a process starts with to run on ``name``: its folder first on
    ``LD_LIBRARY_PATH`` (the image's own entries kept after it)."""
    path = [folder(name)] + [p for p in environ.get("LD_LIBRARY_PATH", "").split(":")
                             if p and p != folder(name)]
    return {"LD_LIBRARY_PATH": ":".join(path)}


def switched(name, environ=os.environ):
    """Whether this process started with ``name``'s folder first on LD_LIBRARY_PATH."""
    return environ.get("LD_LIBRARY_PATH", "").split(":")[0] == folder(name)


def name_of(path):
    """The implementation a mapped library file belongs to, by its Debian folder
    (``/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.3`` -> ``blis-pthread``); a
    file elsewhere (a wheel's own OpenBLAS, say) by its file name; None for a file
    that holds no BLAS (Debian's reference LAPACK)."""
    base = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    for name, (_, dir_, _) in LIBRARIES.items():
        if dir_ and parent == dir_:
            return name
    if base.startswith("libmkl_rt"):
        return "mkl"
    if not any(marker in base.lower() for marker in LIBRARY_MARKERS):
        return None
    return base


def loaded(paths):
    """The BLAS implementations among mapped library files, sorted, each once."""
    return sorted({n for n in (name_of(p) for p in paths) if n})


def mapped(fragment="", maps="/proc/self/maps"):
    """The files mapped into this process whose path holds ``fragment`` (in lower case),
    sorted, each once; none where the map cannot be read."""
    try:
        with open(maps) as f:
            lines = [line.split() for line in f]
    except OSError:
        return []
    return sorted({fields[-1] for fields in lines
                   if len(fields) >= 6 and fragment in fields[-1].lower()})


def mapped_libraries(maps="/proc/self/maps"):
    """The BLAS and LAPACK libraries (and oneDNN) mapped into this process, by real path."""
    found = set()
    for path in mapped(maps=maps):
        name = os.path.basename(path).lower()
        if name.startswith("lib") and ".so" in name and \
                any(k in name for k in ("blas", "lapack", "mkl", "blis", "dnnl")):
            found.add(os.path.realpath(path))
    return sorted(found)


def openblas():
    """The OpenBLAS mapped into this process, loaded again by its path (so the same
    instance, running on the threads it was given), or None."""
    import ctypes
    for path in mapped("openblas"):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(library, "openblas_get_num_threads"):
            return library
    return None


def openblas_threads():
    """``openblas_get_num_threads()`` of the OpenBLAS this process runs on, or None."""
    library = openblas()
    return None if library is None else int(library.openblas_get_num_threads())


def multiarch_dir():
    """Debian's multiarch library folder (``/usr/lib/x86_64-linux-gnu``)."""
    triplet = sysconfig.get_config_var("MULTIARCH") or "%s-linux-gnu" % os.uname().machine
    return "/usr/lib/%s" % triplet


def install(names):
    """apt-get installs the libraries, makes a folder of links for each and keeps the
    first the system's default (run as root while an image is built)."""
    names = [canonical(n) for n in names]
    packages = sorted({LIBRARIES[n][0] for n in names} | {REFERENCE_LAPACK})
    subprocess.run(["apt-get", "update"], check=True)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + packages, check=True)
    libdir = multiarch_dir()
    triplet = os.path.basename(libdir)
    for name in names:
        _, blas_dir, lapack_dir = LIBRARIES[name]
        target = os.path.join(ROOT, name)
        os.makedirs(target, exist_ok=True)
        for soname, source in (("libblas.so.3", blas_dir), ("liblapack.so.3", lapack_dir),
                               ("libopenblas.so.0", blas_dir if name.startswith("openblas") else None)):
            if soname == "libopenblas.so.0" and source is None:
                continue        # OpenBLAS by its own name too (Theano links it so)
            real = os.path.join(libdir, source, soname) if source else os.path.join(libdir, MKL_FILE)
            if not os.path.exists(real):
                raise BlasError("%s: %s is not there after installing %s"
                                % (name, real, LIBRARIES[name][0]))
            link = os.path.join(target, soname)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(real, link)
    for soname in ("libblas.so.3", "liblapack.so.3"):   # the first, the system's default
        subprocess.run(["update-alternatives", "--set", "%s-%s" % (soname, triplet),
                        os.path.realpath(os.path.join(ROOT, names[0], soname))], check=True)
    shutil.rmtree("/var/lib/apt/lists", ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "install":
        sys.exit("usage: blas.py install NAME...  (the first is the image's default)")
    install(sys.argv[2:])
