cd gpu-bundle && timeout 150 bash bench/dump_shadow_check.sh old bin $OUT/dsc cuda > $OUT/dsc.txt 2>&1
