"""hatchling build hook: builds the library and ipccache-config with the
project's Makefile, puts them and the tools into the package, and tags the
wheel with the platform the built files really need.

The tag comes from the files, not from this machine: the newest GLIBC_x.y
symbol version any shipped ELF file needs gives manylinux_x_y (never below
2_17, the oldest manylinux that covers aarch64), and the ELF header gives the
architecture. CC selects the compiler as for make (CC=aarch64-linux-gnu-gcc
makes an aarch64 wheel).
"""

import os
import re
import subprocess

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ARCHES = {"X86-64": "x86_64", "AArch64": "aarch64"}
FLOOR = (2, 17)


def readelf(*args):
    return subprocess.run(["readelf", "--wide"] + list(args), check=True,
                          capture_output=True, text=True).stdout


def elf_arch(path):
    machine = re.search(r"Machine:\s+(.*)", readelf("-h", path)).group(1)
    for key, arch in ARCHES.items():
        if key in machine:
            return arch
    raise RuntimeError("%s: unsupported machine %r" % (path, machine))


def glibc_needed(path):
    """The newest GLIBC_x.y version PATH needs; (0, 0) for none (static)."""
    versions = re.findall(r"Name: GLIBC_(\d+)\.(\d+)", readelf("-V", path))
    return max([(int(a), int(b)) for a, b in versions], default=(0, 0))


def platform_tag(paths):
    arches = {elf_arch(p) for p in paths}
    if len(arches) != 1:
        raise RuntimeError("mixed architectures in the wheel: %s" % sorted(arches))
    major, minor = max([FLOOR] + [glibc_needed(p) for p in paths])
    return "manylinux_%d_%d_%s" % (major, minor, arches.pop())


def strip_copy(cc, path):
    """A copy of PATH without debug information or local symbols (the build
    keeps them for tests and profiles); the binutils of CC's target."""
    prefix = cc[:-len("gcc")] if cc.endswith("gcc") else ""
    out = path[:-len(".so")] + ".stripped.so"
    subprocess.run([prefix + "strip", "--strip-unneeded", "-o", out, path], check=True)
    return out


class MakeHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        root = self.root
        cc = os.environ.get("CC", "cc")
        machine = subprocess.run([cc, "-dumpmachine"], check=True, capture_output=True,
                                 text=True).stdout.split("-")[0]
        build = os.path.join("build", "wheel-" + machine)
        lib = os.path.join(build, "libipccache.so")
        config = os.path.join(build, "ipccache-config")
        subprocess.run(["make", "--no-print-directory", "BUILD=" + build, lib, config],
                       cwd=root, check=True)

        stripped = strip_copy(cc, os.path.join(root, lib))
        shipped = {
            stripped: "ipccache/lib/libipccache.so",
            config: "ipccache/bin/ipccache-config",
            "tools/ipccache-run": "ipccache/bin/ipccache-run",
            "tools/ipccache-stats": "ipccache/bin/ipccache-stats",
        }
        for src, dst in shipped.items():
            build_data["force_include"][os.path.join(root, src)] = dst
        # Into the environment's share/man, where man finds it from its bin/.
        build_data["shared_data"][os.path.join(root, "tools/ipccache.7")] = \
            "share/man/man7/ipccache.7"
        build_data["pure_python"] = False
        build_data["tag"] = "py3-none-" + platform_tag(
            [os.path.join(root, lib), os.path.join(root, config)])
