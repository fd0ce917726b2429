# --precision bf16 in every lab (tests/test_bf16.py): equivalence of the layouts,
# memory and traffic = the bf16 formulas, checkpoints across precision
foreach(case equivalence resume)
  add_lab_test(bf16_${case} test_bf16.py ${case})
endforeach()
