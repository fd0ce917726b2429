# The lessons against the programs (docs/lesson-shape.md): their shape, links and
# answers without running anything, then each lesson's commands and checked
# transcripts (a few seconds each, on the CPU).
add_lab_test(lessons_static test_lessons.py static)
set_tests_properties(lessons_static PROPERTIES LABELS lessons)
foreach(lesson lab00_concepts lab01_dp lab02_zero lab03_pp_naive lab04_1f1b lab05_tp lab06_3d lab07_cp lab08_ep lab09_5d)
  string(SUBSTRING ${lesson} 0 5 short)
  add_test(NAME lessons_${short} COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/test_lessons.py run
           ${CMAKE_SOURCE_DIR}/${lesson})  # README.md and its part files
  set_tests_properties(lessons_${short} PROPERTIES TIMEOUT 300 LABELS lessons
    ENVIRONMENT "${PL_TEST_ENV}")
endforeach()
# The figures that need many steps or a sweep (```console long blocks: plots/lesson_tables.py's tables of
# loss differences, lab06's eight grids, lab08's parting step): every lesson's, once (minutes on 2 cores).
add_test(NAME lessons_long COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/test_lessons.py long)
set_tests_properties(lessons_long PROPERTIES TIMEOUT 3600 LABELS "lessons;long"
  ENVIRONMENT "${PL_TEST_ENV}")
# the reference's transcripts (docs/reference.md: lab07's memory cap), as a lesson's
add_test(NAME lessons_reference COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/test_lessons.py run
         ${CMAKE_SOURCE_DIR}/docs/reference.md)
set_tests_properties(lessons_reference PROPERTIES TIMEOUT 300 LABELS lessons
  ENVIRONMENT "${PL_TEST_ENV}")
