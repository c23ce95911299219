import pytest

from incast.units import (format_rate, format_size, format_time_us, parse_rate, parse_size,
                          parse_time_us)


@pytest.mark.parametrize("text,value", [
    ("32KiB", 32768), ("32KB", 32000), ("1MiB", 1 << 20), ("1500", 1500), (1500, 1500),
    ("64 KiB", 65536), ("1.5KiB", 1536), ("2GiB", 2 << 30), ("10b", 10),
])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text,value", [
    ("1Gbit", 10**9), ("100Mbit", 10**8), ("10kbit", 10**4), ("2.5gbit", 2_500_000_000), (1000, 1000),
])
def test_rates(text, value):
    assert parse_rate(text) == value


@pytest.mark.parametrize("text,value", [
    ("200ms", 200_000), ("200us", 200), ("200µs", 200), ("1s", 1_000_000), ("1000ns", 1), (5, 5),
])
def test_times(text, value):
    assert parse_time_us(text) == value


@pytest.mark.parametrize("func,text", [
    (parse_size, "32XB"), (parse_size, "-1KiB"), (parse_size, "lots"), (parse_size, True),
    (parse_rate, "1G"), (parse_rate, "fast"), (parse_time_us, "200"), (parse_time_us, "1ns"),
    (parse_time_us, "3parsecs"),
])
def test_rejects(func, text):
    with pytest.raises(ValueError):
        func(text)


def test_round_trips():
    assert format_size(32768) == "32KiB"
    assert format_size(1 << 20) == "1MiB"
    assert format_size(1000) == "1000B"
    assert format_rate(10**9) == "1Gbit"
    assert format_time_us(200_000) == "200ms"
    assert format_time_us(200) == "200us"


def test_a_guests_output_is_followed_line_by_line(tmp_path):
    """The host hands on each complete line of output.txt as the guest writes it, and
    keeps a line cut mid-write until its end arrives."""
    from incast.vm.guest import LineFollower
    out, seen = tmp_path / "output.txt", []
    follow = LineFollower(out, seen.append)
    follow()                                  # not written yet
    out.write_bytes(b"network of 3 hosts built\nblock 1/")
    follow()
    assert seen == ["network of 3 hosts built"]
    with open(out, "ab") as f:
        f.write(b"5\nblock 2/5\n")
    follow()
    assert seen == ["network of 3 hosts built", "block 1/5", "block 2/5"]
