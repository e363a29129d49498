import pytest

from cachepilot.backends.inspect import parse_bcache_size
from cachepilot.errors import UserError


@pytest.mark.parametrize("text, value", [("0", 0), ("512", 512), ("64.0k", 65536), ("5.8M", int(5.8 * (1 << 20))),
                                         ("1.0G\n", 1 << 30)])
def test_bcache_sizes(text, value):
    assert parse_bcache_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "5.8Q", "1.0.0k"])
def test_bcache_size_garbage_is_a_clear_error(text):
    with pytest.raises(UserError, match="unexpected bcache size"):
        parse_bcache_size(text)
