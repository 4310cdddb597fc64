// The Billing page's card payment and "add a card": Stripe.js (loaded before this file, from the
// configured address) sets the card up in Stripe Elements; the form then posts the set-up's id
// to the service, which charges the card (or saves it). 3-D Secure, when the bank asks, is
// completed here too.
(function () {
  "use strict";
  const authenticate = document.getElementById("authenticate");
  if (authenticate) {
    const stripe = Stripe(authenticate.dataset.publishableKey);
    stripe.confirmCardPayment(authenticate.dataset.clientSecret).then(function () {
      window.location.assign(authenticate.dataset.returnUrl);
    });
    return;
  }
  const form = document.getElementById("card-payment");
  if (!form) {
    return;
  }
  const stripe = Stripe(form.dataset.publishableKey);
  const card = stripe.elements().create("card");
  card.mount("#card-element");
  const problem = document.getElementById("card-problem");
  const button = form.querySelector("button[type=submit]");
  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    button.disabled = true;
    problem.textContent = "";
    const result = await stripe.confirmCardSetup(form.dataset.clientSecret, {
      payment_method: { card: card },
    });
    if (result.error) {
      problem.textContent = result.error.message || "The card was declined.";
      form.elements.error_code.value = result.error.code || "card_declined";
      form.elements.error_message.value = result.error.message || "";
    }
    form.submit();
  });
})();
