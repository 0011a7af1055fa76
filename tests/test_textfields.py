"""Numeric fields changed as text: exact or refused, never a wrong swap."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.io.textfields import (
    INTEGER,
    NUMBER,
    field_pattern,
    positions,
    swap_all,
    swap_fields,
    swap_in_lines,
    swap_one,
)

PID = field_pattern(b'"pid":')
TS = field_pattern(b'"ts":', NUMBER)


def plus_ten(numbers):
    return (b'"pid":%d' % (int(number) + 10) for number in numbers)


def test_every_key_and_its_number_swapped_when_the_count_is_right():
    text = b'{"pid":1,"tid":2}\n{"ph":"X","pid":-3}'
    assert swap_all(PID, text, plus_ten, 2) == b'{"pid":11,"tid":2}\n{"ph":"X","pid":7}'


def test_spaced_keys_as_kineto_writes_them_keep_the_spaces_of_a_number_put_back():
    spaced = field_pattern(b'"pid":', spaced=True)
    text = b'{"pid": 1, "tid": 2}\n{"ph": "X", "args": {"pid":\t-3 }}'
    assert swap_all(spaced, text, plus_ten, 2) == b'{"pid":11, "tid": 2}\n{"ph": "X", "args": {"pid":7 }}'
    assert swap_all(spaced, text, lambda numbers: (b'"pid":' + number for number in numbers), 2) == text
    assert swap_all(spaced, b'{"pid": 1 .5}', plus_ten, 1) is None  # spaces do not join a number's parts
    assert swap_all(PID, text, plus_ten, 2) is None  # not spaced: a space after the colon refuses


def test_spaced_keys_are_found_with_spaces_before_the_colon_too():
    """Every member of the name is found in one-line JSON, however it is
    spaced: a count of keys then tells which lines hold them."""
    spaced = field_pattern(b'"pid":', spaced=True)
    text = b'{"pid" : 1, "tid": 2}\n{"args": {"pid"\t:\t-3}, "name": "pid", "pids": 4}'
    assert swap_all(spaced, text, plus_ten, 2) == b'{"pid":11, "tid": 2}\n{"args": {"pid":7}, "name": "pid", "pids": 4}'
    assert swap_all(spaced, b'{"pid" : 1, "args": {"pid":2}}', plus_ten, 1) is None  # two members of the name


@pytest.mark.parametrize("text, expected", [
    (b'{"pid":1}\n{"pid":2}', 1),  # more keys than expected
    (b'{"pid":1}', 2),  # fewer
    (b'{"pid":"a"}\n{"pid":2}', 2),  # a key without a number
    (b'{"pid":1.5}\n{"pid":2}', 2),  # not an integer
    (b'{"pid":12x}\n{"pid":2}', 2),  # digits not ending the value
])
def test_a_count_or_number_that_does_not_fit_refuses(text, expected):
    assert swap_all(PID, text, plus_ten, expected) is None


def test_a_key_inside_a_string_is_escaped_so_never_matched():
    line = json.dumps({"name": 'say "pid":5', "pid": 1}, separators=(",", ":")).encode()
    assert swap_all(PID, line, plus_ten, 1) == line.replace(b'"pid":1}', b'"pid":11}')


def test_numbers_in_exponent_form_are_one_number():
    text = b'{"ts":1.5e3,"dur":2}'
    shifted = swap_all(TS, text, lambda numbers: (b'"ts":<%s>' % number for number in numbers), 1)
    assert shifted == b'{"ts":<1.5e3>,"dur":2}'


def test_fields_in_turn_and_a_missing_key_that_must_be_missing():
    tid = field_pattern(b'"tid":')
    text = b'{"pid":1,"tid":2}'
    both = swap_fields(text, [(PID, plus_ten, 1), (tid, lambda n: [b'"tid":9'], 1)])
    assert both == b'{"pid":11,"tid":9}'
    assert swap_fields(text, [(tid, lambda n: [], 0)]) is None  # expected absent, but there
    assert swap_fields(text, [(field_pattern(b'"id":'), lambda n: [], 0)]) == text


def test_only_the_chosen_lines_change():
    lines = [b'{"pid":1}', b'{"pid":2}', b'{"pid":3}']
    assert swap_in_lines(lines, [0, 2], PID, plus_ten)
    assert lines == [b'{"pid":11}', b'{"pid":2}', b'{"pid":13}']
    twice = [b'{"pid":1,"args":{"pid":4}}', b'{"pid":2}']
    assert not swap_in_lines(twice, [0], PID, plus_ten) and twice[0] == b'{"pid":1,"args":{"pid":4}}'
    assert swap_in_lines(twice, [], PID, plus_ten)


def test_one_line_swap():
    assert swap_one(b'{"pid":1,"x":2}', PID, plus_ten) == b'{"pid":11,"x":2}'
    assert swap_one(b'{"x":2}', PID, plus_ten) is None
    assert swap_one(b'{"pid":1,"a":{"pid":2}}', PID, plus_ten) is None
    assert swap_one(b'{"pid":"1"}', PID, plus_ten) is None


def test_positions():
    assert positions(bytearray(b"\x00\x02\x01\x02"), 2) == [1, 3]
    assert positions(b"", 1) == [] and positions(b"\x01", 0) == []


values = st.one_of(st.integers(-2**70, 2**70), st.text(max_size=6), st.floats(allow_nan=False, allow_infinity=False),
                   st.none(), st.lists(st.integers(), max_size=2))
events = st.dictionaries(st.sampled_from(["pid", "tid", "name", "args", "x"]),
                         st.one_of(values, st.dictionaries(st.sampled_from(["pid", "y"]), values, max_size=2)),
                         max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, min_size=1, max_size=6))
def test_a_swap_either_is_what_decoding_gives_or_is_refused(batch):
    """Against decode-change-encode: every top-level integer pid + 10."""
    lines = [json.dumps(event, separators=(",", ":")).encode() for event in batch]
    with_pid = sum(1 for event in batch if "pid" in event)
    swapped = swap_all(PID, b"\n".join(lines), plus_ten, with_pid)
    if swapped is None:
        return
    assert all(type(event.get("pid")) is int for event in batch if "pid" in event)
    expected = [{**event, "pid": event["pid"] + 10} if "pid" in event else event for event in batch]
    assert [json.loads(line) for line in swapped.split(b"\n")] == expected


def test_integer_pattern_is_whole_values_only():
    assert INTEGER.match(b"12,").group() == b"12" and INTEGER.match(b"12.5,") is None
