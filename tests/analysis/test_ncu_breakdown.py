"""analysis/ncu_breakdown.py on a small ncu CSV written here: two steps of a 1-layer model, the
second one read, split into phases and categories (no GPU needed)."""

from conftest import run_script

import ncu_breakdown

HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
         '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'

STEP = [  # (kernel, ns)
    ("fsdpq::<unnamed>::find_bad_id_kernel(const int *, long, long, int *)", "3,000"),
    ("void fsdpq::<unnamed>::nf4_dequantize_kernel<__nv_bfloat16, 1>(const unsigned char *)", "20,000"),
    ("void fsdpq::cuda::lora_down_sm90a_kernel<__nv_bfloat16, __nv_bfloat16, 3>(Maps, Params)", "30,000"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "100,000"),
    ("void fsdpq::<unnamed>::swiglu_forward8_kernel<__nv_bfloat16>(float)", "40,000"),
    ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT", "150,000"),  # the head's logits
    ("void fsdpq::<unnamed>::cross_entropy_kernel<__nv_bfloat16, __nv_bfloat16>(const T1 *)", "60,000"),
    ("void fsdpq::<unnamed>::rmsnorm_dx_kernel<__nv_bfloat16>(float)", "10,000"),
    ("void fsdpq::cuda::attention_dkdv_sm90a_kernel<__nv_bfloat16, 128, 0>(Params)", "90,000"),
    ("nvjet_sm90_tss_32x64_64x16_2x4_h_bz_NNN", "11,000"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_badd_coopA_NNT", "200,000"),
    ("void fsdpq::<unnamed>::sq_partials_kernel<1>(const float *)", "18,000"),
    ("void fsdpq::<unnamed>::step_kernel<AdamOp, NoCompute, 1>(float *)", "40,000"),
]


def csv_row(launch, kernel, metric, value):
    """One (launch, metric) row as ncu --csv writes it."""
    return (f'"{launch}","1","fsdpq","h","{kernel}","1","13","(256, 1, 1)","(8, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","","{value}"\n')


def write_csv(tmp_path):
    lines, i = [HEADER, "==PROF== a line ncu prints that is not CSV\n"], 0
    for step in (STEP, STEP):
        for name, ns in step:
            lines.append(csv_row(i, name, "gpu__time_duration.sum", ns))
            i += 1
    path = tmp_path / "ncu.csv"
    path.write_text("".join(lines))
    return str(path)


def test_phases_and_categories(tmp_path):
    step = ncu_breakdown.last_step(ncu_breakdown.kernels(write_csv(tmp_path)))
    assert len(step) == len(STEP)
    parts = ncu_breakdown.phases(step)
    assert [len(parts[k]) for k in ("forward", "head", "backward", "optimizer")] == [5, 3, 3, 2]
    assert sum(us for _, us in parts["head"]) == 220.0
    cats = {name: ncu_breakdown.category(name) for name, _ in step}
    assert cats["nvjet_sm90_tss_32x64_64x16_2x4_h_bz_NNN"] == "LoRA"
    assert cats["nvjet_sm90_tst_256x128_64x4_1x2_h_badd_coopA_NNT"] == "base GEMMs"
    assert cats["attention_dkdv_sm90a_kernel<__nv_bfloat16, 128, 0>"] == "attention"
    assert cats["nf4_dequantize_kernel<__nv_bfloat16, 1>"] == "dequantise"


def test_the_report(tmp_path):
    r = run_script("ncu_breakdown.py", write_csv(tmp_path), "--layers", "1", "--top", "2")
    assert r.returncode == 0, r.stderr
    assert "kernels in the step: 13, busy 0.77 ms" in r.stdout
    assert "| forward | 5 | 193 | 193 |" in r.stdout
    # per layer: the forward's and backward's GEMMs (100 + 200), not the head's (150)
    assert "| base GEMMs | 450 | 300 |" in r.stdout
    assert "| loss | 60 | 0 |" in r.stdout


def test_the_roofline_columns_where_ncu_recorded_them(tmp_path):
    """Each launch with the duration and METRICS_FOR_ROOFLINE: the kernel table adds its DRAM rate
    over its launches' time and the time-weighted speed-of-light percentages."""
    lines, i = [HEADER], 0
    extra = {  # the two launches of one kernel in the last step, and one other kernel
        "find_bad_id_kernel": [(1000, 0, 0, 1.0, 1.0)],
        "swiglu_forward8_kernel": [(2000, 3e6, 1e6, 10.0, 90.0), (6000, 9e6, 3e6, 20.0, 70.0)],
    }
    for _ in range(2):  # two steps: the first one's values must not count
        for kernel, measurements in extra.items():
            for ns, read, write, sm, mem in measurements:
                values = [("gpu__time_duration.sum", ns), ("dram__bytes_read.sum", read), ("dram__bytes_write.sum", write),
                          ("sm__throughput.avg.pct_of_peak_sustained_elapsed", sm),
                          ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", mem)]
                lines += [csv_row(i, f"void fsdpq::<unnamed>::{kernel}(int)", metric, value) for metric, value in values]
                i += 1
    path = tmp_path / "roofline.csv"
    path.write_text("".join(lines))
    r = run_script("ncu_breakdown.py", str(path))
    assert r.returncode == 0, r.stderr
    # 16 MB over 8 µs = 2,000 GB/s; SM (10·2 + 20·6) / 8 = 17.5 %, memory (90·2 + 70·6) / 8 = 75 %
    assert "| swiglu_forward8_kernel | 2 | 8 | 2,000 | 18 | 75 |" in r.stdout, r.stdout
    assert "DRAM GB/s" in r.stdout


def test_a_profile_without_a_step_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text(HEADER)
    r = run_script("ncu_breakdown.py", str(path))
    assert r.returncode == 1 and "no step in the profile" in r.stderr
