"""HPACK (edge/core/hpack.py) against the RFC 7541 examples and the `hpack` package."""

from __future__ import annotations

import random

import hpack
import pytest

from edge.core.hpack import CompressionError, Decoder, Encoder, encode_integer


def test_rfc7541_c3_requests_without_huffman_share_one_dynamic_table() -> None:
    decoder = Decoder()
    first = bytes.fromhex("828684410f7777772e6578616d706c652e636f6d")
    assert decoder.decode(first) == ([(b":method", b"GET"), (b":scheme", b"http"),
                                      (b":path", b"/"), (b":authority", b"www.example.com")],
                                     False)
    second = bytes.fromhex("828684be58086e6f2d6361636865")
    assert decoder.decode(second)[0][-2:] == [(b":authority", b"www.example.com"),
                                              (b"cache-control", b"no-cache")]
    third = bytes.fromhex("828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565")
    assert decoder.decode(third)[0] == [
        (b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"),
        (b":authority", b"www.example.com"), (b"custom-key", b"custom-value")]
    assert decoder.size == 164  # RFC 7541 C.3.3's table size


def test_rfc7541_c4_requests_with_huffman() -> None:
    decoder = Decoder()
    decoder.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff"))
    fields, _ = decoder.decode(bytes.fromhex("828684be5886a8eb10649cbf"))
    assert fields[-1] == (b"cache-control", b"no-cache")
    fields, _ = decoder.decode(bytes.fromhex(
        "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"))
    assert fields[-1] == (b"custom-key", b"custom-value")


def test_rfc7541_c5_a_small_table_evicts_oldest_first() -> None:
    decoder = Decoder(max_table_bytes=256)
    decoder.table_bytes = 256
    blocks = [
        "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a3231"
        "20474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d",
        "4803333037c1c0bf",
        "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a6970"
        "7738666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d61"
        "67653d333630303b2076657273696f6e3d31",
    ]
    for block in blocks:
        fields, _ = decoder.decode(bytes.fromhex(block))
    assert fields[0] == (b":status", b"200")
    assert fields[-1][0] == b"set-cookie"
    assert decoder.size == 215  # RFC 7541 C.5.3
    assert [name for name, _ in decoder.table] == [b"set-cookie", b"content-encoding", b"date"]


@pytest.mark.parametrize("block, why", [
    (b"\x80", "index 0"),
    (b"\xbe", "an index past the dynamic table"),
    (b"\x82\x3f\xe1\x1f", "a size update after a field"),
    (b"\x3f\xe2\x1f", "a size update over the allowed size"),
    (b"\xff\xff\xff\xff\xff\xff\x7f", "an integer too large"),
    (b"\xff\xff", "a block that ends inside an integer"),
    (b"\x40\x05ab", "a string longer than its block"),
    (b"\x40", "a block that ends inside a field"),
    (b"\x40\x81\xff\x01a", "a Huffman string that is all EOS padding bits"),
])
def test_coding_errors_are_compression_errors(block: bytes, why: str) -> None:
    with pytest.raises(CompressionError):
        Decoder().decode(block)


def test_a_table_size_update_at_the_start_shrinks_the_table() -> None:
    decoder = Decoder()
    decoder.decode(b"\x40\x01a\x01b")
    assert len(decoder.table) == 1
    fields, _ = decoder.decode(b"\x20\x82")  # size 0, then :method GET
    assert fields == [(b":method", b"GET")] and not decoder.table and decoder.table_bytes == 0


def test_an_hpack_bomb_costs_its_bytes_not_its_expansion() -> None:
    decoder = Decoder(max_list_bytes=8192)
    decoder.decode(b"\x40\x01x" + encode_integer(4000, 7, 0) + b"y" * 4000)  # one big entry
    fields, over = decoder.decode(b"\xbe" * 10_000)  # 10,000 references to it: 40 MB decoded
    assert over and fields == []
    assert decoder.decode(b"\x82") == ([(b":method", b"GET")], False)  # the table in step


def test_our_encoding_decodes_with_the_hpack_package_and_back() -> None:
    rng = random.Random(7)
    encoder = Encoder()
    theirs = hpack.Decoder()
    for _ in range(200):
        fields = [(b":status", rng.choice([b"200", b"404", b"503", b"101"])),
                  (b"content-length", b"%d" % rng.randrange(10**9)),
                  (rng.choice([b"server", b"x-custom", b"set-cookie"]),
                   bytes(rng.randrange(32, 127) for _ in range(rng.randrange(0, 300))))]
        assert theirs.decode(encoder.encode(fields), raw=True) == fields


def test_the_hpack_packages_encoding_decodes_alike_across_blocks() -> None:
    rng = random.Random(11)
    theirs = hpack.Encoder()
    ours = Decoder()
    names = [b":authority", b"user-agent", b"x-a", b"cookie", b"accept"]
    for _ in range(300):
        fields = [(rng.choice(names), bytes(rng.randrange(32, 127)
                                            for _ in range(rng.randrange(0, 120))))
                  for _ in range(rng.randrange(1, 8))]
        huffman = rng.random() < 0.5
        assert ours.decode(theirs.encode(fields, huffman=huffman)) == (fields, False)


def test_long_huffman_strings_are_not_memoised() -> None:
    from edge.core import hpack as ours

    theirs = hpack.Encoder()
    short, long = b"s" * 20, bytes(range(33, 127)) * 3
    Decoder().decode(theirs.encode([(b"x-short", short), (b"x-long", long)], huffman=True))
    memo = ours._HUFFMAN
    assert short in memo.values() and long not in memo.values()
    assert all(len(raw) <= ours._MEMO_STRING for raw in memo)
