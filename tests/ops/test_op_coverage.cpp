// test_op_coverage.cpp: fails when an OpKind lacks a kind of test it needs, so a new op cannot land untested.
// Tests declare what they cover through MS_OP_TEST (or the case table in test_cpu_ops_fast.cpp), registered at
// static-initialisation time, so this works when ctest runs each test in its own process.
#include <set>
#include <utility>

#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

// The checks every op needs. No default: -Wswitch flags a new OpKind here until someone decides.
std::vector<Check> required_checks(OpKind op) {
    std::vector<Check> checks = {Check::kFastVsReference, Check::kDeterminism};
    switch (op) {
        case OpKind::kEmbeddingForward:
        case OpKind::kLayerNormForward:
        case OpKind::kMatmulForward:
        case OpKind::kGeluForward:
            checks.push_back(Check::kGradient);  // the finite differences differentiate the forward
            break;
        case OpKind::kEmbeddingBackward:
        case OpKind::kLayerNormBackward:
        case OpKind::kMatmulBackward:
        case OpKind::kAttentionBackward:
        case OpKind::kGeluBackward:
        case OpKind::kCrossEntropyBackward:
            checks.push_back(Check::kGradient);
            checks.push_back(Check::kContract);  // += / Accumulate / overwrite / masking
            break;
        case OpKind::kAttentionForward:     // causality
        case OpKind::kCrossEntropyForward:  // masked padding
            checks.push_back(Check::kGradient);
            checks.push_back(Check::kContract);
            break;
        case OpKind::kLmHeadLoss:
            checks.push_back(Check::kExact);     // the reference is bit-identical to the unfused reference ops
            checks.push_back(Check::kGradient);  // dlnf, dwte vs finite differences of the losses
            checks.push_back(Check::kContract);  // dwte +=, dlnf =, masked padding, forward only, chunking
            break;
        case OpKind::kResidualForward:
            checks.push_back(Check::kExact);
            checks.push_back(Check::kContract);  // out may alias a
            break;
        case OpKind::kLayerNormResidualForward:
            checks.push_back(Check::kExact);     // bit-identical to residual_forward then layernorm_forward
            checks.push_back(Check::kContract);  // residual_out may alias residual_a, out residual_b
            break;
        case OpKind::kAdamW:
        case OpKind::kSumSquares:
            checks.push_back(Check::kExact);
            break;
        case OpKind::kCast:
            checks.push_back(Check::kExact);     // round trips of representable values, ties to even
            checks.push_back(Check::kContract);  // same dtype copies, in place is a no-op, half -> half rounds once
            break;
        case OpKind::kRmsNormForward:
        case OpKind::kSwiGluForward:
            checks.push_back(Check::kGradient);
            break;
        case OpKind::kRmsNormBackward:
        case OpKind::kSwiGluBackward:
            checks.push_back(Check::kGradient);
            checks.push_back(Check::kContract);  // Accumulate, dweight += (16-bit: rounded once), overwrite
            break;
        case OpKind::kRope:
            checks.push_back(Check::kExact);     // the hand-computed rotation
            checks.push_back(Check::kGradient);  // the inverse is the forward's transpose (its backward)
            checks.push_back(Check::kContract);  // the inverse undoes the forward, V untouched, positions
            break;
        case OpKind::kAttentionBlockForward:
            checks.push_back(Check::kContract);  // blocks compose to causal attention; overwrite and merge
            break;
        case OpKind::kAttentionBlockBackward:
            checks.push_back(Check::kGradient);  // the blocks' gradients are attention_backward's
            checks.push_back(Check::kContract);  // dq and dkv +=
            break;
        case OpKind::kCopyColumns:
            checks.push_back(Check::kExact);  // conversions and column offsets
            break;
        case OpKind::kCount:
            break;
    }
    return checks;
}

const char* check_name(Check c) {
    switch (c) {
        case Check::kGradient:
            return "gradient";
        case Check::kExact:
            return "exact";
        case Check::kFastVsReference:
            return "fast-vs-reference";
        case Check::kContract:
            return "contract";
        case Check::kDeterminism:
            return "determinism";
    }
    return "?";
}

TEST(OpCoverage, EveryOpKindHasEveryRequiredTest) {
    std::set<std::pair<int, int>> have;
    for (const OpTestEntry& e : op_test_registry()) have.insert({static_cast<int>(e.op), static_cast<int>(e.check)});
    for (int op = 0; op < static_cast<int>(OpKind::kCount); ++op) {
        for (Check check : required_checks(static_cast<OpKind>(op))) {
            EXPECT_TRUE(have.count({op, static_cast<int>(check)}))
                << "OpKind " << op << " (backend.h order) has no " << check_name(check)
                << " test (see tests/ops/op_test_util.h)";
        }
    }
}

}  // namespace
}  // namespace ms::test
