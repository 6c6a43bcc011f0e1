from simulator.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, Tokenizer

PROSE = (
    "Scheduling requests for a large model is a hard problem. Users send prompts of very "
    "different lengths, and a server can hold only a limited number of sequences in memory at "
    "once. When the memory fills, the engine must pause some requests and recompute them "
    "later, which wastes work. A good router watches each server and sends new work where it "
    "will finish soonest, while trying to reuse text that a server has already seen."
)


def test_round_trip_of_prose_and_unicode(tokenizer: Tokenizer) -> None:
    for text in (PROSE, "héllo wörld ✓ 東京 — 42,000 tokens!\n\tend", ""):
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_encoding_is_deterministic_across_instances(tokenizer: Tokenizer) -> None:
    assert Tokenizer().encode(PROSE) == tokenizer.encode(PROSE)


def test_prose_averages_between_three_and_five_chars_per_token(tokenizer: Tokenizer) -> None:
    ratio = len(PROSE) / len(tokenizer.encode(PROSE))
    assert 3.0 < ratio < 5.0, ratio


def test_ids_stay_inside_the_fixed_vocabulary(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(PROSE + "\u2603\x00")
    assert all(0 <= t < VOCAB_SIZE for t in ids)
    assert all(0 <= t < VOCAB_SIZE for t in tokenizer.generatable)


def test_bos_only_when_asked_and_specials_decode_to_nothing(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("hi", add_bos=True)[0] == BOS_ID
    assert BOS_ID not in tokenizer.encode("hi")
    assert tokenizer.decode([BOS_ID, *tokenizer.encode("hi"), EOS_ID]) == "hi"
    assert tokenizer.decode([BOS_ID], skip_special=False) == "<|begin_of_text|>"


def test_chat_template_ends_with_generation_prompt_or_open_message(tokenizer: Tokenizer) -> None:
    msgs = [("user", "Hi"), ("assistant", "Hello the")]
    with_prompt = tokenizer.apply_chat_template(msgs[:1], add_generation_prompt=True)
    assert tokenizer.decode(with_prompt, skip_special=False).endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    cont = tokenizer.apply_chat_template(
        msgs, add_generation_prompt=False, continue_final_message=True
    )
    assert tokenizer.decode(cont).endswith("Hello the")
    assert cont[-1] != EOS_ID
