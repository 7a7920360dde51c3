"""Reading the end of a growing file: last lines, and the lines appended since the last look.

The rule for a file that is not the one followed any more: truncated, replaced (a new
inode) or rewritten in place, it is read again from its start.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workbench.system.file_tail import AppendedLines, last_lines


def write(path: Path, text: str, mode: str = "a") -> None:
    with open(path, mode, encoding="utf-8") as handle:
        handle.write(text)


def numbered(count: int) -> str:
    return "".join(f"line {i}\n" for i in range(count))


@pytest.mark.parametrize("ending", ["\n", ""])
def test_last_lines_are_the_end_of_the_file_with_or_without_a_final_newline(tmp_path, ending):
    path = tmp_path / "x.log"
    path.write_text(numbered(200) + "tail" + ending)
    assert last_lines(path, 3) == ["line 198", "line 199", "tail"]
    assert last_lines(path, 1000)[0] == "line 0"
    assert last_lines(path, 0) == []


def test_last_lines_of_a_missing_file_are_none(tmp_path):
    assert last_lines(tmp_path / "nope.log", 5) == []


def test_last_lines_read_only_the_end_and_leave_out_a_cut_line(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("x" * 100_000 + "\n" + numbered(3))
    assert last_lines(path, 10, max_bytes=1000) == ["line 0", "line 1", "line 2"]
    path.write_text("y" * 100_000)
    assert last_lines(path, 1, max_bytes=1000) == []


def test_appended_lines_hold_back_a_line_until_it_is_complete(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("one\ntw")
    follower = AppendedLines(path)
    assert follower.read() == [b"one"]
    write(path, "o\nthree\n")
    assert follower.read() == [b"two", b"three"]
    assert follower.read() == []


def truncate(path: Path, text: str) -> None:
    path.write_text(text)


def replace_by_rename(path: Path, text: str) -> None:
    replacement = path.with_suffix(".new")
    replacement.write_text(text)
    os.replace(replacement, path)


@pytest.mark.parametrize("replace", [truncate, replace_by_rename])
@pytest.mark.parametrize("new_text", ["new\n", "new 1, longer than the old text\nnew 2\n"])
def test_a_truncated_or_replaced_file_is_read_again_from_its_start(tmp_path, replace, new_text):
    path = tmp_path / "x.log"
    path.write_text("old 1\nold 2\n")
    follower = AppendedLines(path)
    assert follower.read() == [b"old 1", b"old 2"]
    replace(path, new_text)
    assert follower.read() == [line.encode() for line in new_text.splitlines()]
    assert follower.restarts == 1


def test_a_deleted_file_is_waited_for_and_read_from_its_start_when_it_returns(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("first life\n")
    follower = AppendedLines(path)
    assert follower.read() == [b"first life"]
    path.unlink()
    assert follower.read() == []
    # Whether or not the new file gets the old inode number, its first bytes differ.
    path.write_text("second life, a longer first line\n")
    assert follower.read() == [b"second life, a longer first line"]


def test_a_file_rewritten_in_place_to_the_same_length_is_read_again(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("aaaa\n")
    follower = AppendedLines(path)
    assert follower.read() == [b"aaaa"]
    with open(path, "r+b") as handle:  # same inode, same size, other bytes
        handle.write(b"bbbb\ncc\n")
    assert follower.read() == [b"bbbb", b"cc"]


def test_following_from_the_last_lines_starts_there_then_hands_out_what_is_appended(tmp_path):
    path = tmp_path / "x.log"
    path.write_text(numbered(100))
    follower = AppendedLines.from_last_lines(path, 2)
    assert follower.read() == [b"line 98", b"line 99"]
    write(path, "line 100\n")
    assert follower.read() == [b"line 100"]


def test_following_a_file_that_does_not_exist_yet_reads_all_of_it_once_it_does(tmp_path):
    path = tmp_path / "later.log"
    follower = AppendedLines.from_last_lines(path, 1)
    assert follower.read() == []
    path.write_text(numbered(3))
    assert follower.read() == [b"line 0", b"line 1", b"line 2"]


def test_one_read_hands_over_at_most_read_limit_bytes(tmp_path):
    path = tmp_path / "x.log"
    path.write_text(numbered(1000))
    follower = AppendedLines(path, read_limit=100)
    first = follower.read()
    assert 0 < len(first) < 1000 and follower.bytes_read == 100
    rest = []
    while chunk := follower.read():
        rest += chunk
    assert [*first, *rest] == [f"line {i}".encode() for i in range(1000)]


def test_each_line_comes_with_the_offset_just_past_it_across_held_back_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, "one\ntw")
    tail = AppendedLines(path, read_limit=3)  # slices cut lines in the middle
    ends = []
    for _ in range(5):
        ends += tail.read_with_ends()
    write(path, "o\nthree\n")
    for _ in range(5):
        ends += tail.read_with_ends()
    content = path.read_bytes()
    assert [line for line, _ in ends] == [b"one", b"two", b"three"]
    assert [end for _, end in ends] == [4, 8, 14]
    assert all(content[end - 1 : end] == b"\n" for _, end in ends)


def test_resuming_past_a_line_hands_out_only_what_follows_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, "one\ntwo\n")
    first = AppendedLines(path)
    (_, end), _ = first.read_with_ends()
    write(path, "three\n")
    resumed = AppendedLines.resuming(path, first.inode, end)
    assert resumed.read() == [b"two", b"three"]
    assert resumed.restarts == 0


@pytest.mark.parametrize("replace", ["new inode", "shorter"])
def test_resuming_in_another_or_a_shorter_file_starts_from_its_start(tmp_path, replace):
    path = tmp_path / "metrics.jsonl"
    write(path, "one\ntwo\n")
    inode = os.stat(path).st_ino
    if replace == "new inode":
        path.unlink()
        write(tmp_path / "other", "")  # keeps the freed inode from coming straight back
        write(path, "fresh\nfile\nlonger\n")
        assert os.stat(path).st_ino != inode
    else:
        write(path, "x\n", mode="w")
    resumed = AppendedLines.resuming(path, inode, 8)
    assert resumed.read() == ([b"fresh", b"file", b"longer"] if replace == "new inode" else [b"x"])
    assert resumed.restarts == 1
