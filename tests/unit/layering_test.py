#!/usr/bin/env python3
"""Every #include of the project's headers runs down the library arrows.

The arrows are the CMake targets' dependencies (cmake/ShardlineLibrary.cmake
writes them to BUILD/layers.txt): a file in folder F may include a header of
folder F itself or of any folder F's library depends on, directly or through
others. An include that runs up or sideways (common/ including worker/, the
comm library including the engine's headers) is named with its file and
line, and the test fails. Files in folders without a library (client/,
bench/, tests/) sit on top and may include anything.

  layering_test.py BUILD_DIR [SOURCE_DIR]
  layering_test.py --self-test      the checker catches a planted upward include
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")


def read_layers(path):
    """folder -> set of folders it may include (itself and its closure)."""
    direct = {}
    with open(path) as f:
        for line in f:
            folder, _, deps = line.partition(":")
            direct.setdefault(folder.strip(), set()).update(deps.split())
    closure = {}

    def reach(folder, seen):
        for dep in direct.get(folder, ()):
            if dep not in seen:
                seen.add(dep)
                reach(dep, seen)
        return seen

    for folder in direct:
        closure[folder] = reach(folder, {folder})
    return closure


def violations(root, layers):
    """(file, line number, included header, why) for each include against the arrows."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("build", "third_party")]
        folder = os.path.relpath(dirpath, root)
        if folder not in layers:
            continue
        for name in sorted(filenames):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = os.path.dirname(m.group(1))
                    if target in layers and target not in layers[folder]:
                        found.append((os.path.relpath(path, root), lineno, m.group(1),
                                      f"{folder} does not depend on {target}"))
    return found


def self_test():
    """A checker that passes everything would pass the tree too: plant one upward include."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "low"))
        os.makedirs(os.path.join(tmp, "high"))
        with open(os.path.join(tmp, "layers.txt"), "w") as f:
            f.write("low: \nhigh: low\n")
        with open(os.path.join(tmp, "high", "a.h"), "w") as f:
            f.write('#include "low/b.h"\n')
        with open(os.path.join(tmp, "low", "b.h"), "w") as f:
            f.write('#include <string>\n#include "high/a.h"\n')
        layers = read_layers(os.path.join(tmp, "layers.txt"))
        found = violations(tmp, layers)
        assert [(v[0], v[1]) for v in found] == [("low/b.h", 2)], found
    print("self-test: a planted upward include is found")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    build = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    layers = read_layers(os.path.join(build, "layers.txt"))
    if len(layers) < 10:
        print(f"{build}/layers.txt lists {len(layers)} libraries; expected the project's")
        return 1
    found = violations(root, layers)
    for path, lineno, header, why in found:
        print(f"{path}:{lineno}: includes {header}: {why}")
    checked = ", ".join(sorted(layers))
    print(f"{len(found)} includes against the arrows in {len(layers)} folders ({checked})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
