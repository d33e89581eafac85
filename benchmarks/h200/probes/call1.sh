# Nsight Compute on the three Hopper kernels and cuDNN's dense causal kernels, headline shape
# (S=32K, 16/16 x 128, block 512, top-3): speed of light, memory and compute workload tables.
set -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
ncu --clock-control none -k regex:'moba_(fwd|dq|dkv)|cudnn|sdpa|flash|fmha' -c 12 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section LaunchStats --section Occupancy \
    --metrics lts__t_bytes.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second \
    -o "$OUT/ncu" python3 experiments/ncu_moba.py --backend mosaic --cudnn > "$OUT/ncu.log" 2>&1
echo "ncu exit $?"
tail -5 "$OUT/ncu.log"
ncu --import "$OUT/ncu.ncu-rep" --page details --csv > "$OUT/ncu.csv" 2>&1
echo "import exit $?"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
want = ("Duration", "L2 Cache Throughput", "DRAM Throughput", "Compute (SM) Throughput",
        "Memory Throughput", "lts__t_bytes.sum", "lts__t_sector_hit_rate.pct",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes_read.sum", "L1/TEX Hit Rate", "Executed Ipc Active", "SM Frequency",
        "Registers Per Thread")
by = collections.OrderedDict()
for r in rows:
  key = (r.get("ID"), r.get("Kernel Name", "")[:60])
  if r.get("Metric Name") in want:
    by.setdefault(key, []).append(f"{r['Metric Name']}={r['Metric Value']} {r.get('Metric Unit','')}")
for (i, name), vals in by.items():
  print(i, name)
  for v in vals:
    print("   ", v)
PY
