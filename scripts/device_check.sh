#!/usr/bin/env bash
# One device call (see ../shared/device/README.md): GPU tests, HF/PEFT reference checks, a 4-rank run.
# Prepare here: make build; ./fsdpq demo --out .device/demo --dry_run;
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device", "build/tests/fsdpq_gpu_tests", "build/fsdpq"]: bash scripts/device_check.sh
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$PWD/build/fsdpq; D=$PWD/.device/demo; W=$(mktemp -d); cd $W
echo "== gpu tests"; "$OLDPWD/build/tests/fsdpq_gpu_tests" > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc=$?"; tail -4 $OUT/gpu_tests.log
R=$OLDPWD/tests/reference
echo "== check_hf_load"; $B init-model --preset tiny --out tiny --seed 3 > /dev/null && python3 $R/check_hf_load.py tiny --seed 3 > $OUT/hf_load.log 2>&1; echo "rc=$?"; tail -3 $OUT/hf_load.log
echo "== train lora fp32 + peft check"
$B --model_name $D/model --dataset alpaca --data_path $D/data.jsonl --dataset_samples 64 --batch_size 4 --context_length 128 --train_type lora --precision fp32 --lora_rank 8 --lora_alpha 16 --lora_dropout 0 --lr 2e-3 --max_steps 12 --save_model true --output_dir ad --log_to stdout > $OUT/train.log 2>&1; echo "train rc=$?"
$B generate --model $D/model --adapter ad --prompt "Add 2 and 3" --max_new_tokens 1 --temperature 0 --train_type lora --precision fp32 --logits_out logits.json > $OUT/gen.log 2>&1; echo "gen rc=$?"
$B merge --model $D/model --adapter ad --out merged > $OUT/merge.log 2>&1; echo "merge rc=$?"
python3 $R/peft_load_check.py --base $D/model --adapter ad --logits logits.json --merged merged --dtype float32 > $OUT/peft.log 2>&1; echo "peft check rc=$?"; tail -5 $OUT/peft.log
echo "== full fine-tune, 4 MPI ranks (full_shard, CPU ranks: NCCL needs a GPU per rank), saved model loads in HF"
CUDA_VISIBLE_DEVICES= mpirun --allow-run-as-root -x CUDA_VISIBLE_DEVICES --oversubscribe -np 4 -x LD_LIBRARY_PATH -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM $B --model_name $D/model --dataset alpaca --data_path $D/data.jsonl --dataset_samples 64 --batch_size 1 --context_length 128 --train_type full --max_steps 4 --save_model true --output_dir full --log_to stdout > $OUT/full.log 2>&1; echo "full rc=$?"; tail -2 $OUT/full.log
python3 $R/check_hf_load.py full > $OUT/hf_full.log 2>&1; echo "hf full rc=$?"; tail -3 $OUT/hf_full.log
