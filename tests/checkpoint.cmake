# Checkpoints (save, resume across labs and layouts, bad files) and failures
# (a rank killed mid-step, a save that cannot be written): tests/test_checkpoint.py.
foreach(case resume resume_lab06 format refused faults records kill_lab04 kill_lab05 kill_lab06 io_error
             launcher_signals interrupted routing)
  add_lab_test(checkpoint_${case} test_checkpoint.py ${case})
endforeach()
# a hang must fail the test, not stall the suite: 10 s for the job to end, plus start-up
set_tests_properties(checkpoint_kill_lab04 checkpoint_kill_lab05 checkpoint_kill_lab06 checkpoint_io_error checkpoint_faults
                     checkpoint_interrupted
                     PROPERTIES TIMEOUT 120)
# six jobs, each signalled mid-save: 10 s each for the job to end, plus start-up
set_tests_properties(checkpoint_launcher_signals PROPERTIES TIMEOUT 300)
