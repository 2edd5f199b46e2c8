from hypothesis import given
from hypothesis import strategies as st

from server.gateway.stop_strings import StopStringMatcher


def run(stops, pieces):
    m = StopStringMatcher(stops)
    out = ""
    for p in pieces:
        out += m.feed(p)
        if m.matched:
            return out, m.matched
    return out + m.flush(), None


def test_stop_split_across_pieces_is_never_emitted():
    out, matched = run(["END"], ["abc E", "N", "D tail"])
    assert out == "abc " and matched == "END"


def test_held_back_text_is_released_when_no_match():
    out, matched = run(["END"], ["abc E", "N", "x"])
    assert out == "abc ENx" and matched is None


def test_earliest_of_several_stops_wins():
    out, matched = run(["zz", "b"], ["aazzb"])
    assert out == "aa" and matched == "zz"


@given(st.text(max_size=40), st.lists(st.text(min_size=1, max_size=4), max_size=3),
       st.lists(st.integers(1, 5), max_size=20))
def test_equals_truncating_the_whole_text(text, stops, cuts):
    pieces, i = [], 0
    for c in cuts:
        pieces.append(text[i:i + c])
        i += c
    pieces.append(text[i:])
    out, _ = run(stops, pieces)
    hits = [text.find(s) for s in stops if s in text]
    assert out == (text[: min(hits)] if hits else text)


def test_unarmed_text_never_matches_but_a_stop_across_the_arming_point_does():
    m = StopStringMatcher(["END"])
    assert m.feed("xEND", armed=False) == "xE" and m.matched is None  # "ND" held back
    assert m.feed("!") + m.flush() == "ND!" and m.matched is None  # completed while unarmed
    m = StopStringMatcher(["END"])
    assert m.feed("aaEN", armed=False) == "aa"
    assert m.feed("D tail") == "" and m.matched == "END"


def test_turn_markers_end_the_reply_before_min_tokens_and_never_show():
    m = StopStringMatcher(["Paris"], include_stop=True, turn=("\nQuestion:",))
    # Unarmed (min_tokens not yet reached): the client's stop waits, the layout's does not.
    assert m.feed(" Paris\n", armed=False) == ""  # held: a stop could still start in it
    assert m.feed("Question: What", armed=False) == " Paris" and m.matched == "\nQuestion:"
    m = StopStringMatcher(["Paris"], include_stop=True, turn=("\nQuestion:",))
    assert m.feed(" Paris\n") == " Paris" and m.matched == "Paris"  # armed: the client's stays
