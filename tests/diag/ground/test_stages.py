from diag.ground import stages


def test_ttft_stages_are_the_design_cards_six_and_kv_transfer_in_request_order():
    assert stages.TTFT_STAGES == ("tokenize", "queue", "prefill", "comm", "sample", "kv_transfer", "detokenize")
    assert stages.DECOMPOSITION_STAGES[:len(stages.TTFT_STAGES)] == stages.TTFT_STAGES
    assert "kv_transfer_s" in stages.STAGE_COLUMNS


def test_every_stage_has_a_description_and_a_column():
    for st in stages.ALL_STAGES:
        assert stages.STAGE_DESCRIPTIONS[st]
    assert stages.stage_column("prefill") == "prefill_s"
    assert "network_s" in stages.STAGE_COLUMNS


def test_genai_semconv_names_are_used_where_they_exist():
    assert stages.GEN_AI_REQUEST_MODEL == "gen_ai.request.model"
    assert stages.GEN_AI_USAGE_INPUT_TOKENS == "gen_ai.usage.input_tokens"
    assert stages.GEN_AI_USAGE_OUTPUT_TOKENS == "gen_ai.usage.output_tokens"
    ours = [v for k, v in vars(stages).items() if k.startswith("ATTR_")]
    assert ours and all(v.startswith("ttft.") for v in ours)


def test_boundaries_state_start_end_and_what_they_leave_out():
    server = stages.SERVER_BOUNDARY.to_dict()
    client = stages.CLIENT_BOUNDARY.to_dict()
    assert "cold_start" in server["excludes"] and "network" not in server["includes"]
    assert "network" in client["includes"]
    assert "role-only" in client["end"]


def test_lora_names_are_spelled_once_under_ttft_lora_and_ttft_step():
    assert stages.ATTR_LORA_NAME == "ttft.lora.name"
    assert (stages.ATTR_LORA_WAIT_S, stages.ATTR_LORA_LOAD_S) == ("ttft.lora.wait_s", "ttft.lora.load_s")
    assert (stages.ATTR_STEP_WAITING_LORA, stages.ATTR_STEP_LORAS) == ("ttft.step.waiting_lora", "ttft.step.loras")
    assert stages.ATTR_STEP_LORA_LOAD_S == "ttft.step.lora_load_s"
