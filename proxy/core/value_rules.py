"""The patterns values.py finds values with: one regex, compiled at import.

Rules in the order they are tried at a position (the first that matches wins); the
named groups are what ``values._clean`` reads. Label words are plain lists, compiled
into a prefix tree (``_trie``): at each word the scan then tests its first letter
once, not every label in turn, which halves the cost of the labels on prose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeAlias

_Node: TypeAlias = dict[str, "_Node"]  # a prefix tree: a letter to the rest; "" ends a word

# Labels whose value has a digit, or is an amount, a date or a host name.
VALUE_LABELS = (
    *("port", "build", "ticket", "issue", "bug", "incident", "pr", "pull request", "commit"),
    *("invoice", "host", "hostname", "server", "ip", "ip address", "database", "db"),
    *("region", "cluster", "bucket", "extension", "ref", "reference", "tracking"),
    *("budget", "cost", "price", "amount", "fee", "spend", "salary"),
    *("due", "due date", "deadline", "date", "launch", "launch date", "go-live", "cutoff"),
    *("cut-off", "expiry", "expiry date", "expires", "expiration", "expiration date"),
    *("release date", "order", "request", "job", "run", "task", "trace", "case", "user"),
    *("timeout", "limit", "quota", "threshold", "ttl", "capacity", "rate limit"),
)
# "ticket id", "order id": any label may end in id; "order 66" alone is not a label.
ID_ONLY = frozenset({"order", "request", "job", "run", "task", "trace", "case", "user"})
# Labels that name someone or something: their value may be capitalised words.
NAME_LABELS = (
    *("owner", "assignee", "contact", "manager", "reviewer", "approver", "author"),
    *("sponsor", "customer", "client", "on-call", "oncall", "tech lead", "team lead"),
    *("project lead", "codename", "code name", "project", "project name", "team", "name"),
)
# Words between a label and its value: "the port is now 8443", "build number 48213".
LINK_WORDS = (
    *("id", "number", "num", "is", "was", "are", "were", "will", "be", "should", "must"),
    *("of", "at", "to", "set", "on", "by", "now", "currently", "the", "about", "around"),
    *("roughly", "approximately", "exactly", "still", "changed", "moved", "updated"),
    *("bumped", "raised", "lowered", "increased", "reduced"),
    # "The launch date has been fixed: 2027-03-22" (a real-model bench fact no rule read).
    *("has", "have", "had", "been", "fixed", "scheduled", "planned", "agreed", "confirmed"),
)


def _trie(words: Iterable[str]) -> str:
    """An alternation of ``words`` as a prefix tree: ``po(?:rt|licy)`` for port, policy."""
    root: _Node = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    return _render(root)


def _render(node: _Node) -> str:
    ends = "" in node
    branches = [re.escape(char) + _render(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 and not ends else f"(?:{'|'.join(branches)})"
    return f"{body}?" if ends else body


ERROR_WORDS = r"(?i:error|exception|failed|failure|denied|refused|invalid|not found|timed? ?out)"
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]{0,6}\.?"
# What a label's value looks like: an amount, a date, a quantity (37,500; 2.5
# seconds; 15%), a token with a digit in it (8443, TCK-90417, 2026-03-14,
# db-01:5432), a dotted host name.
_AMOUNT = (
    r"[$€£¥][ \t]?\d[\d,]*(?:\.\d+)?(?:[ \t]?(?:[kKmM]\b|million|thousand|billion|bn))?"
    r"|\d[\d,]*(?:\.\d+)?[ \t]?(?:[kKmM][ \t]?)?(?:dollars|USD|EUR|euros?|GBP|pounds)\b"
)
# A number grouped in thousands (37,500, 1,250.50): read whole, not cut at its comma.
_GROUPED = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?"
_UNIT = (
    r"(?:%|(?i:percent|ms|milliseconds?|secs?|seconds?|s|mins?|minutes?|h|hrs?|hours?"
    r"|days?|weeks?|months?|years?|[kmgt]i?b|bytes?|tokens?|rps|qps)\b"
    r"|[kKmM]\b|million\b|billion\b|thousand\b|bn\b)"
)
# A number, grouped or with a decimal part or neither, and maybe its unit; never the
# head of a longer token (2026-03-14, 1.2.3, 5512-AB: _TOKEN reads those).
_NUMBER = rf"(?:{_GROUPED}|\d+\.\d+|\d+)"
_QUANTITY = rf"{_NUMBER}(?:[ \t]?{_UNIT})?(?![\w/:@+#-]|[.,]\d)"
# A value no one mistakes for another word: what a label may be a few words from.
_TYPED = rf"(?:{_GROUPED}|\d+\.\d+|\d+(?=[ \t]?{_UNIT}))(?:[ \t]?{_UNIT})?(?![\w/:@+#-]|[.,]\d)"
_ISO_DATE = r"\d{4}-\d{2}-\d{2}(?![\w-])"
_DATE = (
    rf"{_MONTH}[ \t]\d{{1,2}}(?:st|nd|rd|th)?(?:,?[ \t]\d{{4}})?\b"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?[ \t]{_MONTH}(?:,?[ \t]\d{{4}})?\b"
)
_TOKEN = r"(?=[\w./:@+#-]{0,79}\d)[A-Za-z0-9#][\w./:@+-]{0,79}+"
_HOST = r"[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)+\b"
# Capitalised words (O'Neil, O\u2019Neil) or an email address.
_NAME = r"[A-Z][\w'\u2019-]*+(?:[ \t][A-Z][\w'\u2019-]*+){0,3}|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_LINK = rf"(?:[ \t]*(?:[:=#]|no\.|\b{_trie(LINK_WORDS)}\b)){{0,4}}[ \t]*"
# A name may follow its label as an apposition too: "our reviewer, Marcus Oyelaran".
_NAME_LINK = rf"(?:[ \t]*(?:[:=#,]|\b{_trie(LINK_WORDS)}\b)){{0,4}}[ \t]*"
# A label some words before its value, in the same clause: "the budget for the quarter
# is", "the price per seat is", "the tech lead on this is". Only a value that cannot be
# another word's (an amount, a date, a quantity, or a name after "is") is read so far.
_FAR = r"(?:[ \t]+[a-z][a-z'-]*+){1,4}?"
_CONST = r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+"
# A setting's name: constant-case (one word of three letters or more too: ``BUCKET =
# s3-archive-17`` was quoted by its label alone), or with a dot or underscore in it.
_SETTING = rf"(?:{_CONST}|[A-Z][A-Z0-9]{{2,}}(?![\w.-])|[A-Za-z][\w-]*(?:[._][\w-]+)+)"
_VALUE_CHARS = r"[^\s,;'\"`)\]}(]"
_VALUE_TRIE = _trie(VALUE_LABELS)
# "the request timeout is 2.5 s": a label that needs "id" labels nothing far off.
_NOT_FAR = "".join(f"(?i:(?<!{label}))" for label in sorted(ID_ONLY))
_NAME_TRIE = _trie(NAME_LABELS)
_WORD_RULES = (
    rf"(?P<kv>(?P<kvk>[A-Za-z_][\w.-]{{0,63}})="
    rf"(?:{_GROUPED}(?!\w|,\d)|[^\s,;'\"`)\]}}]{{1,200}}))",
    rf"(?P<spaced>(?P<sk>{_SETTING})(?:[ \t]+=[ \t]*|=[ \t]+)"
    rf"(?P<sv>{_GROUPED}(?!\w|,\d)|[^\s=]{_VALUE_CHARS}{{0,199}}+)(?!\())",
    rf"(?P<assign>(?P<ak>{_CONST})(?:[ \t]+(?:is|was|to|at)[ \t]+|:[ \t]*)"
    rf"(?P<av>{_AMOUNT}|{_QUANTITY}|{_TOKEN}|{_HOST}))",
    # A dotted or snake-case key, then a colon or a word: "max_connections to 200".
    rf"(?P<colon>(?P<ck>[A-Za-z][\w-]*(?:[._][\w-]+)+)(?::|[ \t]+(?:is|was|to|at))[ \t]+"
    rf"(?P<cv>{_AMOUNT}|{_QUANTITY}|{_TOKEN}|{_HOST}))",
    # A label, then either a few linking words and any value, or a few words of its
    # clause and a typed value; one label test for both.
    rf"(?P<labelled>(?P<ll>(?i:{_VALUE_TRIE})(?i:[ _-]?id)?)\b"
    rf"(?:(?P<link>{_LINK})(?P<lv>{_AMOUNT}|{_DATE}|{_QUANTITY}|{_TOKEN}|{_HOST})"
    rf"|{_NOT_FAR}(?P<flink>{_FAR})[ \t]*(?:[:=][ \t]*)?"
    rf"(?P<fv>{_AMOUNT}|{_DATE}|{_ISO_DATE}|{_TYPED})))",
    rf"(?P<named>(?P<nl>(?i:{_NAME_TRIE}))"
    rf"(?:\b{_NAME_LINK}(?P<nv>{_NAME})|{_FAR}[ \t]+(?:is|was|:)[ \t]+(?P<nfv>{_NAME})))",
)
_OTHER_RULES = (
    r"(?P<url>https?://[^\s<>\"'`)\]}]{2,500})",
    r"(?P<path>(?<![/.])(?:\.{1,2}/|/)?(?:[\w.-]+/)+[\w-]+\.[A-Za-z0-9]{1,10}(?![\w/]))",
    # Cheap to try: the digit check is one scan of the token; the rest is in _clean.
    r"(?P<id>(?=[\w-]*[0-9])[A-Za-z0-9][\w-]{5,79}(?![\w-]))",
    r"(?P<code>[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])|E[0-9]{3,6}(?![\w-])"
    r"|E(?:CONN|NO|ACCES|TIMEDOUT|ADDR|PIPE|HOST|NET|PERM|EXIST|INVAL|AGAIN"
    r"|BUSY|ISDIR|NOTDIR|MFILE)[A-Z]*(?![\w-]))",
)
# "the release manager for this project is X": the label is the one a name ends
# before "for/of ... <label>", not the nearest (X was quoted as ``project: X``).
OWNER_OF = re.compile(
    rf"(?i:\b({_trie(NAME_LABELS)})[ \t]+(?:for|of|on)[ \t]+(?:(?:the|this|that|our)[ \t]+)?)$"
)
_QUOTED = (
    rf"(?P<quoted>`[^`\n]{{0,200}}{ERROR_WORDS}[^`\n]{{0,200}}`"
    rf"|\"[^\"\n]{{0,200}}{ERROR_WORDS}[^\"\n]{{0,200}}\")"
)
# Every rule but the quoted error starts a word: one shared look-behind rejects the
# middle of a word before any rule is tried, which keeps the scan near one pass.
RULES = re.compile(
    rf"(?<![\w-])(?:(?<!\.)(?:{'|'.join(_WORD_RULES)})|{'|'.join(_OTHER_RULES)})|{_QUOTED}"
)
