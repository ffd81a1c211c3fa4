// A tiny autograd demo: fit y = 3x - 1 with one weight and one bias by
// gradient descent, printing the loss, and show the three hook points firing.
#include <cstdio>

#include "autograd/accumulate_grad.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "tensor/grad_mode.h"

using namespace loom;
using namespace loom::autograd;

int main() {
  Generator gen(0);
  Tensor x = randn({64, 1}, gen);
  Tensor y = ops::add(ops::mul(x, 3.0), -1.0);  // targets, no grad
  Tensor w = zeros({1, 1}), b = zeros({1});
  set_requires_grad(w);
  set_requires_grad(b);

  int accumulations = 0;
  auto acc = grad_accumulator(w);  // keep the node alive, as picotron keeps grad_acc_fn
  RemovableHandle acc_hook = acc->register_hook([&](Tensor&) { ++accumulations; });  // registered while it lives
  RemovableHandle post_hook = register_post_accumulate_grad_hook(b, [&](Tensor& p) { (void)p; ++accumulations; });

  for (int step = 0; step < 50; ++step) {
    Tensor pred = matmul(x, w) + b;
    Tensor loss = mean(pow(pred - y, 2.0));
    bool callback_ran = false;
    RemovableHandle queue_hook =
        register_post_accumulate_grad_hook(w, [&](Tensor&) { Engine::queue_callback([&] { callback_ran = true; }); });
    backward(loss);
    queue_hook.remove();
    {
      NoGradGuard no_grad;  // the update itself is not part of the graph
      ops::add_(w, grad(w), -0.1);
      ops::add_(b, grad(b), -0.1);
    }
    zero_grad({w, b});
    if (step % 10 == 0 || step == 49)
      std::printf("step %2d  loss %.6f  w %.4f  b %.4f  (hooks fired %d, callback %s)\n", step, loss.item<double>(),
                  w.item<double>(), b.item<double>(), accumulations, callback_ran ? "ran" : "missing");
  }
  return 0;
}
