# --precision bf16 in every lab (tests/test_bf16.py): equivalence of the layouts,
# memory and traffic = the bf16 formulas, checkpoints across precision; the
# step's time by kernel kind (PL_KERNEL_TIMES=1) changes no result
foreach(case equivalence resume kernel_times)
  add_lab_test(bf16_${case} test_bf16.py ${case})
endforeach()
