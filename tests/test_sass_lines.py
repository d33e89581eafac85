"""experiments/sass_lines.py's reader of an nvdisasm listing with line info."""

from experiments.sass_lines import per_line

_LISTING = '''
	//## File "/src/pallas_kernels/moba/hopper.py", line 445
        /*0a10*/                   FFMA R4, R4, R2, -R3 ;
        /*0a20*/                   MUFU.EX2 R4, R4 ;
        /*0a30*/               @!P0 MUFU.EX2 R5, R5 ;
	//## File "/src/pallas_kernels/moba/hopper.py", line 981
        /*0a40*/                   STL [R1+0x3c], R3            (*"SpillRefill"*) ;
        /*0a50*/                   LDL.64 R8, [R1+0x10] ;
	.L_x_12:
	//## File "/src/pallas_kernels/moba/hopper.py", line 445
        /*0a60*/                   FADD R6, R6, R4 ;
'''


def test_counts_instructions_per_source_line_and_lists_spills():
  counts, spills = per_line(_LISTING)
  assert dict(counts[("hopper.py", 445)]) == {"FFMA": 1, "MUFU": 2, "FADD": 1}
  assert dict(counts[("hopper.py", 981)]) == {"STL": 1, "LDL": 1}
  assert spills == [("hopper.py", 981, "STL [R1+0x3c], R3"), ("hopper.py", 981,
                                                              "LDL.64 R8, [R1+0x10]")]
