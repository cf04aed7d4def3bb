#!/usr/bin/env bash
# One device call: fill the bare GPU image's missing packages from .whl/ (see shared wheelhouse), then run the
# measurements named in $@ (attention VARIANTS_JSON | attention_ab VARIANTS_JSON | attention_ws | attention_ncu VARIANTS_JSON CELLS | attention_prefill_ncu VARIANTS_JSON CELLS | attention_grid | attention_full | attention_packed | campaign_attention |
# model | model_moe | model_graphs | model_speed | policy | policy_attention_ab | policy_glue | norm_backward | linear_backward | concurrent CAMPAIGN | linear_grouped | family_checks FAMILIES | knob_moves FAMILIES | rowwise_sweep | rowwise_ncu CELLS | ops FAMILIES | routing_variants VARIANTS_JSON | rowwise FAMILIES | linear_variants VARIANTS_JSON | linear_ncu VARIANTS_JSON CELLS | matmul FAMILIES | linear_full_ab FILE | campaign FILE | audit_profile FAMILY KNOBS | attention_host | attention_gluon_decode | paged_decode | screen_ab CAMPAIGN | ray_ab CAMPAIGN | rl | hf), each under its own
# time limit, writing under $OUT. Keeps going when one step fails so one call measures everything it can. Each step
# runs a `tik-evo bench` suite as `python3 -m tik_evo.cli bench NAME` (PYTHONPATH=$PWD: importing tik_evo maps
# tik_evo_bench and tik_evo_kernels to benchmarks/ and kernels/).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
# transformers, its dependencies and Liger-Kernel for the rl and hf steps, where carried (.whl_hf)
if ls .whl_hf/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl_hf/*.whl >/dev/null 2>&1 || echo "hf wheel install failed"
fi
# Ray Core, slimmed to fit a call (benchmarks/ray_wheel.sh builds .whl_ray), for the ray_ab step
if ls .whl_ray/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl_ray/*.whl >/dev/null 2>&1 || echo "ray wheel install failed"
fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
# A knob search with fork-server audits (spawn if that run ends within two minutes, e.g. the root audit
# failed), then its status, lineage, export and summary under $OUT.
campaign() {
  local name run t0 rc ex
  name=$(basename "$1" .yaml)
  for ex in forkserver spawn; do
    run=/tmp/runs/${name}_$ex; t0=$(date +%s)
    timeout $(( ${CAMPAIGN_WALL_S:-330} + 90 )) python3 -m tik_evo.cli run "$1" ${CAMPAIGN_ONLY:-} \
      search.max_evaluations=${CAMPAIGN_EVALS:-16} search.seed=${CAMPAIGN_SEED:-0} \
      search.wall_time_s=${CAMPAIGN_WALL_S:-330} evaluate.retime_best=false evaluate.executor=$ex store.path=$run 2>&1 | tail -8
    rc=$?; echo "executor $ex: rc $rc after $(( $(date +%s) - t0 )) s"
    python3 -m tik_evo.cli status $run | tail -20
    python3 -m tik_evo.cli lineage $run > "$OUT/${name}_lineage.txt" 2>&1
    python3 -m tik_evo.cli export $run -o "$OUT/${name}_export.jsonl" && gzip -f "$OUT/${name}_export.jsonl"
    python3 -m tik_evo.cli bench campaign-summary $run "$OUT/${name}.json" 2>&1 | tail -3
    [ $(( $(date +%s) - t0 )) -gt 120 ] && break
  done
}

while [ $# -gt 0 ]; do
  step=$1; shift
  echo "== $step $(date -u +%T)"  # step start times: what a later call can fit in its limit
  case $step in
    attention) v=$1; shift  # ATTN_ARGS passes more flags (e.g. "--grid --decode-only")
      timeout $(( ${ATTN_BUDGET_S:-330} + 50 )) python3 -m tik_evo.cli bench attention --variants-json "$v" \
        --budget-s ${ATTN_BUDGET_S:-330} ${ATTN_CHECK:+--check-variants $ATTN_CHECK} ${ATTN_ARGS:-} \
        --out "$OUT/attention_$(basename "$v" .json).json" 2>&1 | tail -40 ;;
    attention_ab) v=$1; shift  # prefill variants against cuDNN, graphs replayed in interleaved rounds (AB_CELLS regex)
      timeout $(( ${AB_BUDGET_S:-400} + 120 )) python3 -m tik_evo.cli bench attention-ab --variants-json "$v" \
        --cells "${AB_CELLS:-}" --rounds ${AB_ROUNDS:-7} --budget-s ${AB_BUDGET_S:-400} \
        --out "$OUT/attention_ab_$(basename "$v" .json).json" 2>&1 | tail -40 ;;
    attention_ncu) v=$1; cells=$2; shift 2  # decode launches of some variants under Nsight Compute
      rep=/tmp/decode_ncu; order="$OUT/decode_ncu_order.json"
      timeout 300 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section SourceCounters -f -o $rep python3 -m tik_evo.cli bench attention-ncu run \
        --variants-json "$v" --cells "$cells" --order "$order" 2>&1 | tail -12
      ncu --import $rep.ncu-rep --page details --csv > /tmp/decode_ncu_details.csv 2>/dev/null
      : > /tmp/decode_ncu_sass.csv
      n=$(python3 -c "import json; print(len(json.load(open('$order'))))" 2>/dev/null || echo 0)
      for i in $(seq 0 $(( n - 1 ))); do
        echo "#kernel $(python3 -c "import json; print(json.load(open('$order'))[$i])")" >> /tmp/decode_ncu_sass.csv
        ncu --import $rep.ncu-rep --page source --csv --print-source sass -k regex:^_decode_kernel \
          --launch-skip $i --launch-count 1 >> /tmp/decode_ncu_sass.csv 2>&1
      done
      python3 -m tik_evo.cli bench attention-ncu summarize --details /tmp/decode_ncu_details.csv \
        --sass /tmp/decode_ncu_sass.csv --order "$order" --out "$OUT/decode_ncu.json" 2>&1 | tail -5
      gzip -c /tmp/decode_ncu_details.csv > "$OUT/decode_ncu_details.csv.gz"
      gzip -c /tmp/decode_ncu_sass.csv > "$OUT/decode_ncu_sass.csv.gz" ;;
    attention_prefill_ncu) v=$1; cells=$2; shift 2  # prefill launches (Triton or Gluon) under Nsight Compute
      rep=/tmp/prefill_ncu; order="$OUT/prefill_ncu_order.json"
      timeout ${NCU_TIMEOUT_S:-300} ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section SourceCounters --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
        -f -o $rep python3 -m tik_evo.cli bench attention-ncu run --phase prefill ${NCU_CUDNN:+--cudnn} \
        --variants-json "$v" --cells "$cells" --order "$order" 2>&1 | tail -12
      ncu --import $rep.ncu-rep --page details --csv > /tmp/prefill_ncu_details.csv 2>/dev/null
      : > /tmp/prefill_ncu_sass.csv  # per launch of ours, the SASS with its stall samples (the peer's is closed)
      labels=$(python3 -c "import json; print(' '.join(l.replace(' ', '_') for l in json.load(open('$order')) if not l.startswith('cudnn ')))" 2>/dev/null)
      i=0; for l in $labels; do
        echo "#kernel $l" >> /tmp/prefill_ncu_sass.csv
        ncu --import $rep.ncu-rep --page source --csv --print-source sass -k regex:prefill_kernel \
          --launch-skip $i --launch-count 1 >> /tmp/prefill_ncu_sass.csv 2>&1
        i=$(( i + 1 ))
      done
      python3 -m tik_evo.cli bench attention-ncu summarize --details /tmp/prefill_ncu_details.csv \
        --sass /tmp/prefill_ncu_sass.csv --order "$order" --kernel prefill_kernel --out "$OUT/prefill_ncu.json" 2>&1 | tail -5
      gzip -c /tmp/prefill_ncu_details.csv > "$OUT/prefill_ncu_details.csv.gz"
      gzip -c /tmp/prefill_ncu_sass.csv > "$OUT/prefill_ncu_sass.csv.gz" ;;
    linear_ncu) v=$1; cells=$2; shift 2  # linear launches and cuBLAS's on the same cells under Nsight Compute (v: file or root)
      rep=/tmp/linear_ncu; order="$OUT/linear_ncu_order.json"
      timeout ${NCU_TIMEOUT_S:-300} ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        --metrics lts__t_bytes.sum,dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum \
        -f -o $rep python3 -m tik_evo.cli bench linear-ncu run --variants-json "$v" --cells "$cells" --order "$order" \
        2>&1 | tail -12
      ncu --import $rep.ncu-rep --page details --csv > /tmp/linear_ncu_details.csv 2>/dev/null
      python3 -m tik_evo.cli bench linear-ncu summarize --details /tmp/linear_ncu_details.csv --order "$order" \
        --out "$OUT/linear_ncu.json" 2>&1 | tail -5
      gzip -c /tmp/linear_ncu_details.csv > "$OUT/linear_ncu_details.csv.gz" ;;
    attention_grid)  # every cell of the paper grid, root and three Hopper named sets, with per-phase geomeans
      timeout 580 python3 -m tik_evo.cli bench attention --grid --variants root,hopper,hopper_s512_auto,hopper_rowdot_dtile16 \
        --check-variants hopper --budget-s 540 --out "$OUT/attention_grid.json" 2>&1 | tail -70 ;;
    attention_full)
      timeout 540 python3 -m tik_evo.cli bench attention --budget-s 500 --out "$OUT/attention_full.json" 2>&1 | tail -40 ;;
    attention_ws)  # the warp-specialised Gluon prefill: a smoke launch first (a hang must not eat the call),
      # then its bitwise checks and the grid's prefill/train cells against the Triton prefill and cuDNN
      timeout 300 python3 -m tik_evo.cli bench attention-ws --smoke 2>&1 | tail -12
      if [ "${PIPESTATUS[0]}" = 0 ]; then
        timeout $(( ${ATTN_BUDGET_S:-330} + 60 )) python3 -m tik_evo.cli bench attention-ws --budget-s ${ATTN_BUDGET_S:-330} \
          ${WS_ARGS:-} --out "$OUT/attention_ws.json" 2>&1 | tail -60
      fi ;;
    model)
      timeout 150 python3 -m tik_evo.cli bench model ${MODEL_ATTENTION_SET:+--attention-set $MODEL_ATTENTION_SET} \
        --out "$OUT/model_consistency${MODEL_ATTENTION_SET:+_$MODEL_ATTENTION_SET}.json" 2>&1 | tail -15 ;;
    model_moe)  # every family in a Qwen3-30B-A3B-shaped MoE decoder, batched rollout vs packed training (MOE_LAYERS)
      timeout 420 python3 -m tik_evo.cli bench model --model moe --layers ${MOE_LAYERS:-4} --seeds 2 \
        ${MODEL_ATTENTION_SET:+--attention-set $MODEL_ATTENTION_SET} ${MODEL_CONTROL:+--control $MODEL_CONTROL} \
        ${MOE_PER_EXPERT:+--per-expert} \
        --out "$OUT/model_consistency_moe${MOE_LAYERS:+_l$MOE_LAYERS}${MODEL_ATTENTION_SET:+_$MODEL_ATTENTION_SET}${MODEL_CONTROL:+_$MODEL_CONTROL}${MOE_PER_EXPERT:+_per_expert}.json" \
        2>&1 | tail -15 ;;
    model_graphs)  # the rollout with every family call replayed from a CUDA graph: replays == eager, log-probs == training
      timeout 400 python3 -m tik_evo.cli bench model-graphs ${MODEL_GRAPHS_ARGS:-} --out "$OUT/model_graphs.json" 2>&1 | tail -40 ;;
    concurrent) c=$1; shift  # the root on every GPU (timing spread), then the campaign on one GPU and on all (2+ GPUs)
      timeout 560 python3 -m tik_evo.cli bench concurrent-audits "$c" --evals ${CONCURRENT_EVALS:-16} --timeout-s 250 \
        --out "$OUT/concurrent_audits_$(basename "$c" .yaml).json" 2>&1 | tail -20 ;;
    policy)  # the policy update: bits vs training and rollout, gradients vs fp32 torch, step time vs the torch trainer
      timeout 500 python3 -m tik_evo.cli bench policy ${POLICY_ARGS:-} --out "$OUT/policy.json" 2>&1 | tail -20 ;;
    policy_attention_ab)  # the policy step (MoE model) with the packed attention's backward each way, on one card
      for ab in sdpa_per_sequence varlen_flash; do
        timeout 240 python3 -m tik_evo.cli bench policy --configs qwen3-30b-a3b.moe --matmul-backward vendor \
          --attention-backward $ab --reps ${POLICY_REPS:-7} --out "$OUT/policy_attention_$ab.json" 2>&1 \
          | grep "policy step\|kernel time" | cut -c1-600
      done ;;
    norm_backward)  # RMSNorm's backward kernel: its schedules at the policy step's shapes against a copy
      timeout 300 python3 -m tik_evo.cli bench norm-backward --out "$OUT/norm_backward.json" 2>&1 | tail -8 ;;
    policy_glue)  # the policy step's glue kernels (MoE combine, dispatch, embedding backward, packed attention) vs the torch they replaced
      timeout 200 python3 -m tik_evo.cli bench policy-glue --out "$OUT/policy_glue.json" 2>&1 | tail -12 ;;
    knob_moves) f=$1; shift  # every one-knob move of the roots of FAMILIES (or all) through the families' checks
      timeout $(( ${MOVES_BUDGET_S:-400} + 60 )) python3 -m tik_evo.cli bench knob-moves "$f" --workers ${MOVES_WORKERS:-12} \
        --budget-s ${MOVES_BUDGET_S:-400} --out "$OUT/knob_moves_$(echo "$f" | tr , _).json" 2>&1 | tail -40 ;;
    family_checks) f=$1; shift  # the families' own checks (as the audit runs them) on their roots
      timeout 400 python3 -m tik_evo.cli bench family-checks "$f" ${FAMILY_CHECKS_LARGE:+--large} ${FAMILY_CHECKS_GRAPHS:+--graphs} --out "$OUT/family_checks_$(echo "$f" | tr , _).json" 2>&1 | tail -30 ;;
    linear_backward)  # the dense linear backward (dedicated kernel, its tiles, transposed forward) vs cuBLAS
      timeout 460 python3 -m tik_evo.cli bench linear-backward --budget-s 400 --out "$OUT/linear_backward.json" 2>&1 | tail -12 ;;
    linear_grouped)  # the experts' grouped launches (+ LINEAR_GROUPED_VARIANTS json) vs torch._grouped_mm / cuBLAS loop
      timeout 480 python3 -m tik_evo.cli bench linear-grouped ${LINEAR_GROUPED_VARIANTS:+--variants-json $LINEAR_GROUPED_VARIANTS} ${LINEAR_GROUPED_ARGS:-} \
        --budget-s ${LINEAR_GROUPED_BUDGET_S:-400} --out "$OUT/linear_grouped.json" 2>&1 | tail -40 ;;
    model_speed)  # the training forward of the model on the unified kernels against cuBLAS / SDPA / torch ops
      timeout 300 python3 -m tik_evo.cli bench model-speed ${MODEL_SPEED_CONFIGS:+--configs $MODEL_SPEED_CONFIGS} ${MODEL_SPEED_ARGS:-} \
        ${MODEL_ATTENTION_SET:+--attention-set $MODEL_ATTENTION_SET} \
        --out "$OUT/model_speed${MODEL_ATTENTION_SET:+_$MODEL_ATTENTION_SET}.json" 2>&1 | tail -34 ;;
    rowwise_sweep)
      timeout ${SWEEP_S:-150} python3 -m tik_evo.cli bench ops-rowwise --sweep ${ROWWISE_FAMILIES:+--families $ROWWISE_FAMILIES} \
        --out "$OUT" 2>&1 | tail -30 ;;
    linear_variants) v=$1; shift  # linear decode variants vs cuBLAS, each bit-checked against the full path
      timeout 230 python3 -m tik_evo.cli bench ops-matmul --linear-variants "$v" --budget-s 170 --linear-full-ms 4096 16384 \
        --out "$OUT/linear_$(basename "$v" .json).json" 2>&1 | tail -45 ;;
    linear_full_ab) v=$1; shift  # full-path variants vs cuBLAS, interleaved over 5 repeats (median per cell; LINEAR_AB_MS="4096 16384")
      timeout 300 python3 -m tik_evo.cli bench ops-matmul --linear-full-ab "$v" --repeats ${LINEAR_AB_REPEATS:-5} --budget-s 240 \
        ${LINEAR_AB_MS:+--full-ab-ms $LINEAR_AB_MS} \
        --out "$OUT/linear_ab_$(basename "$v" .json).json" 2>&1 | grep -v "^linear  " | tail -20 ;;
    matmul) f=$1; shift  # the matmul suite for some of linear,logprob,moe_routing, without torch.compile
      timeout 300 python3 -m tik_evo.cli bench ops-matmul --families "$f" --compile-logprob --compile-routing \
        --budget-s 200 --out "$OUT/matmul_$(echo "$f" | tr , _).json" 2>&1 | tail -45 ;;
    routing_variants) v=$1; shift  # a moe_routing sweep from a JSON list of knob changes, each bit-checked first
      timeout 240 python3 -m tik_evo.cli bench ops-matmul --families moe_routing --compile-routing \
        --routing-variants "$v" --budget-s 200 --out "$OUT/routing_$(basename "$v" .json).json" 2>&1 | tail -40 ;;
    rowwise) f=$1; shift  # row-wise families' checks and peers; OPS_KNOBS='{"family": {knob: value}}' changes the root; ROWWISE_ROUNDS=N interleaved rounds; ROWWISE_EXTRAS='{"family": {"label": "file.py"}}' times kernel files beside the root
      timeout 300 python3 -m tik_evo.cli bench ops-rowwise --families "$f" ${OPS_KNOBS:+--knobs "$OPS_KNOBS"} \
        ${ROWWISE_EXTRAS:+--extras "$ROWWISE_EXTRAS"} \
        ${ROWWISE_ROUNDS:+--rounds $ROWWISE_ROUNDS} --out "$OUT" 2>&1 | tail -40 ;;
    rowwise_ncu) c=$1; shift  # our row-wise kernels against Liger's launch by launch under ncu (cells family:workload,...), caches flushed and not; ROWWISE_EXTRAS as for rowwise
      for cc in all none; do
        rep=/tmp/rowwise_ncu_$cc; order="$OUT/rowwise_ncu_order_$cc.json"
        timeout 240 ncu --profile-from-start off --cache-control $cc --clock-control base \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -f -o $rep \
          python3 -m tik_evo.cli bench rowwise-ncu run --cells "$c" --reps ${NCU_REPS:-7} ${ROWWISE_EXTRAS:+--extras "$ROWWISE_EXTRAS"} \
          --order "$order" 2>&1 | tail -4
        ncu --import $rep.ncu-rep --page raw --csv --print-units base > /tmp/rowwise_ncu_$cc.csv 2>/dev/null
        python3 -m tik_evo.cli bench rowwise-ncu summarize --csv /tmp/rowwise_ncu_$cc.csv --order "$order" --cache $cc \
          --out "$OUT/rowwise_ncu_$cc.json" 2>&1 | tail -12
      done ;;
    ops) f=$1; shift  # OPS_ARGS passes more flags, e.g. "--kernel moe_routing=/tmp/routing.py --best RUN_DIR"
      timeout 300 python3 -m tik_evo.cli bench ops --families "$f" ${OPS_ARGS:-} --out "$OUT" 2>&1 | tail -40 ;;
    audit_profile) f=$1; k=$2; shift 2  # an audit's check stages per case: cold/warm Triton cache, split over processes
      timeout ${AUDIT_PROFILE_S:-300} python3 -m tik_evo.cli bench audit-profile --family "$f" --knobs "$k" \
        --procs ${AUDIT_PROCS:-1,4} --out "$OUT/audit_profile_$f.json" 2>&1 | tail -12 ;;
    attention_host)  # host time per prefill/decode call against SDPA, with profiles
      timeout 300 python3 -m tik_evo.cli bench attention-host-time ${HOST_ARGS:-} --out "$OUT/attention_host_time.json" 2>&1 | tail -60 ;;
    attention_gluon_decode)  # the Gluon decode / prefill against Triton, bit for bit (a quick gate; GLUON_DECODE_SETS picks knob sets)
      timeout 150 python3 -m tik_evo.cli bench attention-gluon-decode ${GLUON_DECODE_SETS:+--sets $GLUON_DECODE_SETS} --out "$OUT/attention_gluon_decode.json" 2>&1 | tail -30 ;;
    paged_decode)  # decode from a paged KV cache vs the contiguous decode, SDPA, flash-attn; bits paged == contiguous (PAGED_ARGS)
      timeout 570 python3 -m tik_evo.cli bench paged-decode ${PAGED_ARGS:-} --out "$OUT/paged_decode.json" 2>&1 | tail -40 ;;
    attention_packed)  # the grid's packed training batches: prefill_packed (root, hopper set) vs torch's varlen flash
      timeout 240 python3 -m tik_evo.cli bench attention --variants root,hopper --cells train_packed --check-variants '' \
        --budget-s 200 --out "$OUT/attention_packed.json" 2>&1 | tail -12 ;;
    campaign_attention)  # the knob search on seven grid cells, one a packed training batch (see campaign below)
      CAMPAIGN_ONLY='workloads.only=[prefill.B1.S4K,prefill.B1.S16K,train_forward.B4.S4K+128,train_packed.B8.T16K,decode.B1.ctx1K,decode.B1.ctx8K,decode.B16.ctx8K]' \
        campaign campaigns/h200_attention.yaml ;;
    campaign) c=$1; shift  # any campaign file; CAMPAIGN_ONLY / _EVALS / _WALL_S / _SEED override its settings
      campaign "$c" ;;
    screen_ab) c=$1; shift  # one campaign with evaluate.screen on, then off: audits per minute, failures by kind
      # SCREEN_ARGS: overrides for both arms (e.g. workloads.only=[...]); SCREEN_ON_ARGS: more for the "on" arm
      # (e.g. evaluate.in_flight=3); each arm's wall seconds go to screen_ab.txt beside its export
      for sc in true false; do
        run=/tmp/runs/screen_$sc; t0=$(date +%s)
        extra=""; [ $sc = true ] && extra=${SCREEN_ON_ARGS:-}
        timeout $(( ${SCREEN_WALL_S:-240} + 60 )) python3 -m tik_evo.cli run "$c" search.max_evaluations=${SCREEN_EVALS:-12} \
          search.wall_time_s=${SCREEN_WALL_S:-240} search.seed=0 evaluate.screen=$sc ${SCREEN_ARGS:-} $extra \
          store.path=$run 2>&1 | tail -3
        echo "screen=$sc $extra: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/screen_ab.txt"
        python3 -m tik_evo.cli status $run | tail -22
        python3 -m tik_evo.cli export $run -o "$OUT/screen_$sc.jsonl" && gzip -f "$OUT/screen_$sc.jsonl"
        python3 -m tik_evo.cli bench campaign-summary $run "$OUT/screen_$sc.json" 2>&1 | tail -3
      done ;;
    ray_ab) c=$1; shift  # one campaign with the local executor, then through a local Ray cluster: audits per minute
      # RAY_WALL_S / RAY_EVALS; RAY_ARGS: overrides for both; then bench audit-throughput over the two exports
      for ex in local ray; do
        run=/tmp/runs/ray_ab_$ex; t0=$(date +%s)
        extra="evaluate.executor=auto"; [ $ex = ray ] && extra="evaluate.executor=ray evaluate.ray.address=local"
        timeout $(( ${RAY_WALL_S:-150} + 90 )) python3 -m tik_evo.cli run "$c" search.max_evaluations=${RAY_EVALS:-40} \
          search.wall_time_s=${RAY_WALL_S:-150} search.seed=0 ${RAY_ARGS:-} $extra store.path=$run 2>&1 | tail -3
        echo "executor $ex: $(( $(date +%s) - t0 )) s"; python3 -m tik_evo.cli status $run | tail -12
        python3 -m tik_evo.cli export $run -o "$OUT/ray_ab_$ex.jsonl" && gzip -f "$OUT/ray_ab_$ex.jsonl"
      done
      python3 -m tik_evo.cli bench audit-throughput local="$OUT/ray_ab_local.jsonl.gz" ray="$OUT/ray_ab_ray.jsonl.gz" \
        --out "$OUT/ray_ab.json" 2>&1 | tail -6 ;;
    rl)  # the GRPO bench: arms A (vendor stack + recompute), B (unified kernels), C; RL_ARGS overrides the shape
      timeout ${RL_TIMEOUT_S:-300} python3 -m tik_evo.cli bench rl --arms A,B,C ${RL_ARGS:---model qwen3-0.6b-shape \
        --end-fraction 0.004 --steps 4 --skip 1 --prompts 8 --group 8 --prompt-len 64 --max-new 256 --profile} \
        --out "$OUT/rl${RL_TAG:-}.json" 2>&1 | grep -v Warning | tail -24 ;;
    hf)  # the transformers patch: bits generate vs training, speed vs Liger's patch with a profile, inductor
      timeout ${HF_TIMEOUT_S:-280} python3 -m tik_evo.cli bench hf --profile ${HF_ARGS:---batches 2 --batch 64 --rounds 2} \
        --out "$OUT/hf.json" 2>&1 | grep -v Warning | tail -16 ;;
    *) echo "unknown step $step" ;;
  esac
done
