"""Which files look like secrets: `warmpath lsp` sends none of them as another document's context
unless told to (`contextSecrets`), so a `.env` open beside the code does not go to the server with
every keystroke.

By the file's name alone, case-insensitive: `.env*`, `*.pem`, `*.key`, SSH keys (`id_*` without an
extension, or `.pub`), and names containing `secret`, `credential` or `token` (not `tokenize*`: a
tokenizer is code).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from urllib.parse import unquote, urlparse

PATTERNS = (".env*", "*.pem", "*.key", "*secret*", "*credential*")
SSH_KEY = re.compile(r"id_[^.]+(\.pub)?")
TOKEN = re.compile(r"token(?!i[sz])")


def looks_secret(path_or_uri: str) -> bool:
    """Whether a document (a path or a file:// URI) is named like a secret."""
    path = unquote(urlparse(path_or_uri).path) if "://" in path_or_uri else path_or_uri
    name = posixpath.basename(path.replace("\\", "/")).lower()
    return any(fnmatch.fnmatchcase(name, p) for p in PATTERNS) or bool(SSH_KEY.fullmatch(name)) or \
        bool(TOKEN.search(name))
