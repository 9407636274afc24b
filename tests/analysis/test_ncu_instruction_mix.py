"""analysis/ncu_instruction_mix.py on a small SASS page written here as ncu writes it (a title row,
then the header, then one row an instruction), plain and xz-compressed (no GPU needed)."""

import lzma

from conftest import run_script

import ncu_instruction_mix

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "# Samples", "Instructions Executed", "stall_wait", "stall_long_sb", "stall_wait (Not Issued)"]
ROWS = [  # source, samples, executed, wait, long_sb
    ("IMAD.WIDE.U32 R2, R3, R4, RZ", 5, 300, 4, 1),
    ("@!P0 LOP3.LUT R5, R5, R6, RZ, 0x3c, !PT", 3, 200, 3, 0),
    ("@P1 IMAD.MOV.U32 R7, RZ, RZ, R8", 2, 100, 0, 2),
    ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", 10, 20, 1, 9),
]


def write_page(path, compress=False):
    lines = ['"Kernel Name","void k()",']
    lines.append(",".join(f'"{h}"' for h in HEADER))
    for i, (src, samples, executed, wait, long_sb) in enumerate(ROWS):
        lines.append(",".join(f'"{v}"' for v in (hex(16 * i), f"      {src}", samples, samples, samples, executed,
                                                wait, long_sb, wait)))
    text = "\n".join(lines) + "\n"
    if compress:
        with lzma.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def test_counts_by_opcode_without_predicates_or_modifiers(tmp_path):
    page = tmp_path / "k.sass.csv"
    write_page(page)
    executed, samples, stalls = ncu_instruction_mix.mix(str(page))
    assert executed == {"IMAD": 400, "LOP3": 200, "HGMMA": 20}
    assert samples == {"IMAD": 7, "LOP3": 3, "HGMMA": 10}
    assert stalls == {"wait": 8, "long_sb": 12}  # the "(Not Issued)" columns are not counted again


def test_the_command_reads_xz_and_divides_by_the_units(tmp_path):
    page = tmp_path / "k.sass.csv.xz"
    write_page(page, compress=True)
    out = run_script("ncu_instruction_mix.py", page, "--per", 10)
    assert out.returncode == 0, out.stderr
    assert "warp instructions executed 620, 62.00 a unit; stall samples 20" in out.stdout
    assert "IMAD" in out.stdout and "40.00 a unit" in out.stdout
    assert "long_sb" in out.stdout and "60.0%" in out.stdout
