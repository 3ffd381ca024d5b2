"""Lint the Lua scripts with luacheck, as the server runs them.

    python scripts/lint_lua.py    exit 1, with luacheck's report, if any file has a warning

Each file in ``src/redlease/_rules/lua/`` is checked as the server runs it, its includes
in place (see ``_rules/scripts.py``), and so is the library of functions made of them
all; each warning is said at the file and line it came from. Lua 5.1, as Redis and
Valkey run it; the globals a script may read are the server's (``redis``, ``KEYS``,
``ARGV``). What an include defines and a file does not
use is no warning: a helper file serves many scripts. Lines are held to 100 characters.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "src" / "redlease" / "_rules" / "lua"
sys.path.insert(0, str(ROOT / "src"))

from redlease._rules import scripts  # noqa: E402

WIDTH = 100
LIBRARY = "library.lua"
_DEFINED = re.compile(r"^local function (\w+)", re.MULTILINE)
_WARNING = re.compile(r"^([\w.]+):(\d+):(.*)$")


def main() -> int:
    luacheck = shutil.which("luacheck")
    if luacheck is None:
        print("luacheck is not installed (Debian: apt-get install lua-check)", file=sys.stderr)
        return 2
    files = sorted(LUA.glob("*.lua"))
    shared = set(scripts.CONSTANTS)
    for path in files:
        shared.update(_DEFINED.findall(path.read_text()))
    failed = False
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if len(line) > WIDTH:
                print(f"{path.relative_to(ROOT)}:{number}: longer than {WIDTH} characters")
                failed = True
    origins: dict[str, list[tuple[str, int] | None]] = {}
    with tempfile.TemporaryDirectory() as out:
        for path in files:
            lines = scripts.lua_lines(path.stem)
            Path(out, path.name).write_text("".join(text + "\n" for text, _, _ in lines))
            origins[path.name] = [(name, number) for _, name, number in lines]
        # The library of functions: its helpers once, at its top, for every function (a
        # name two helper files define would be one helper for all: 411 says so); a
        # script's own locals may shadow a helper it does not use (431).
        library = scripts.library()
        Path(out, LIBRARY).write_text(library.source)
        origins[LIBRARY] = list(library.origins)
        ignored = [f"211/{name}" for name in sorted(shared)]
        run = subprocess.run(
            [luacheck, "--std", "lua51", "--globals", "redis", "KEYS", "ARGV",
             "--no-max-line-length", "--formatter", "plain", "--codes", "--ignore", *ignored,
             "--", *sorted(p.name for p in files)],
            cwd=out, capture_output=True, text=True, check=False,
        )  # fmt: skip
        in_library = subprocess.run(
            [luacheck, "--std", "lua51", "--globals", "redis",
             "--no-max-line-length", "--formatter", "plain", "--codes", "--ignore", *ignored,
             "431", "212/KEYS", "212/ARGV", "--", LIBRARY],
            cwd=out, capture_output=True, text=True, check=False,
        )  # fmt: skip
    said: set[str] = set()
    for warning in (run.stdout + in_library.stdout).splitlines():
        match = _WARNING.match(warning)
        if match is None:
            said.add(warning)
            continue
        file, line, rest = match.groups()
        origin = origins[file][int(line) - 1]
        if origin is None:  # (the library's own lines)
            said.add(f"the library ({file}, made by scripts.library()):{line}:{rest}")
            continue
        name, number = origin
        said.add(f"{LUA.relative_to(ROOT)}/{name}.lua:{number}:{rest}")
    for warning in sorted(said):
        print(warning)
    if run.returncode != 0 or in_library.returncode != 0 or said:
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
